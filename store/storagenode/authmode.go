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

// TLSMode says whether a storage node requiring credentials speaks TLS.
type TLSMode string

// TLS modes.
const (
	// TLSAuto is TLS whenever credentials are required and the auth dir
	// holds the fleet CA; an auth dir from before TLS keeps its node
	// plaintext, saying so, until `control tls init` gives it a CA.
	TLSAuto TLSMode = "auto"
	// TLSOn requires TLS, and refuses to start without the fleet CA.
	TLSOn TLSMode = "on"
	// TLSOff keeps the node plaintext (a cluster on its way to TLS).
	TLSOff TLSMode = "off"
)

// ParseTLSMode reads a --tls value: on, off or auto ("" is auto).
func ParseTLSMode(s string) (TLSMode, error) {
	switch s {
	case "on", "true":
		return TLSOn, nil
	case "off", "false":
		return TLSOff, nil
	case "auto", "":
		return TLSAuto, nil
	}
	return "", store.Errorf(store.CodeInvalid, "TLS mode %q: want on, off or auto", s).With("tls", s)
}
