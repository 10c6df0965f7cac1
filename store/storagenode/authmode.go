package storagenode

import (
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// AuthMode says whether a storage node requires credentials on every
// connection (operator mode, see auth.go).
type AuthMode string

// Auth modes.
const (
	// AuthAuto requires credentials when any listener (client or cluster)
	// is not a loopback address: the store is never reachable from another
	// box without them.
	AuthAuto AuthMode = "auto"
	// AuthOn always requires credentials.
	AuthOn AuthMode = "on"
	// AuthOff never does; Start still refuses a non-loopback listener
	// without them.
	AuthOff AuthMode = "off"
)

// ParseAuthMode reads an --auth value: on, off or auto, with true and
// false for on and off and "" for auto.
func ParseAuthMode(s string) (AuthMode, error) {
	switch s {
	case "on", "true":
		return AuthOn, nil
	case "off", "false":
		return AuthOff, nil
	case "auto", "":
		return AuthAuto, nil
	}
	return "", store.Errorf(store.CodeInvalid, "auth mode %q: want on, off or auto", s).With("auth", s)
}

// Required reports whether m requires credentials on a node listening on
// listeners (host:port each; "" is no listener). An invalid mode is
// treated as AuthAuto: callers parse it with ParseAuthMode first.
func (m AuthMode) Required(listeners ...string) bool {
	switch m {
	case AuthOn:
		return true
	case AuthOff:
		return false
	}
	for _, a := range listeners {
		if a == "" {
			continue
		}
		// Loose on purpose: any host:port-ish address counts, a bracketed
		// IPv6 host included; an address without a port is left to Start
		// to refuse.
		i := strings.LastIndex(a, ":")
		if i < 0 {
			continue
		}
		if !IsLoopback(strings.Trim(a[:i], "[]")) {
			return true
		}
	}
	return false
}

// Toggle turns a protection of a node requiring credentials on or off:
// TLS (BootConfig.TLS) and encryption at rest (BootConfig.Encrypt).
type Toggle string

// Toggles.
const (
	// ToggleAuto is on when the auth dir holds what the protection needs
	// (the fleet CA, the store key): an auth dir from before it keeps the
	// node without, saying so, until `control tls init` or `control
	// storage encrypt` adds it.
	ToggleAuto Toggle = "auto"
	// ToggleOn requires the protection, and refuses to start without it.
	ToggleOn Toggle = "on"
	// ToggleOff goes without (a cluster on its way to it).
	ToggleOff Toggle = "off"
)

// ParseToggle reads a toggle flag's value: on, off or auto ("" is auto).
func ParseToggle(flag, s string) (Toggle, error) {
	switch s {
	case "on", "true":
		return ToggleOn, nil
	case "off", "false":
		return ToggleOff, nil
	case "auto", "":
		return ToggleAuto, nil
	}
	return "", store.Errorf(store.CodeInvalid, "--%s %q: want on, off or auto", flag, s).With(flag, s)
}
