package store

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Error codes that cross a process boundary. Callers switch on these, never
// on message text.
const (
	CodeBusy              = "busy"
	CodeRPCFailure        = "rpc_failure"
	CodeNotFound          = "not_found"
	CodeInvalid           = "invalid"
	CodeConflict          = "conflict"
	CodeLeaseLost         = "lease_lost"
	CodeUnavailable       = "unavailable"
	CodeQuorumUnavailable = "quorum_unavailable"
	// CodeStoreUnavailable refuses a write (or a read with no local copy
	// to answer it) of a part that keeps working without the store: the
	// store is unreachable, and what the part holds locally keeps being
	// served.
	CodeStoreUnavailable = "store_unavailable"
	// CodeStorageFull refuses a write that JetStream has no room for: a
	// stream or bucket at its size limit, or a storage node out of disk.
	// Nothing already stored was dropped to make room.
	CodeStorageFull = "storage_full"
	// CodeBadSignature refuses intent (a commit, a routing event, a mesh
	// peer record) whose signature does not verify under the trust root.
	CodeBadSignature = "bad_signature"
	// CodeSigningKeyRequired refuses a write of intent by a process that
	// holds no signing key.
	CodeSigningKeyRequired = "signing_key_required"
	CodeStale              = "stale"
	// CodeUpgradeFailed: a machine's upgrade failed and the fleet upgrade
	// stopped there (the machine rolled back by itself).
	CodeUpgradeFailed = "upgrade_failed"
	CodeInternal      = "internal"
	// CodeUnauthorized refuses a login (a dashboard token) that is not
	// known, or not any more.
	CodeUnauthorized = "unauthorized"
	// CodePlaintextRefused refuses to send credentials in plaintext to a
	// server that is not on this box: give the fleet CA and use TLS.
	CodePlaintextRefused = "plaintext_refused"
	// CodeStoreDamaged refuses to start a storage node whose store has a
	// damaged file no other node holds a copy of: it names the file, and
	// the way back is a backup.
	CodeStoreDamaged = "store_damaged"
	// CodeTooOld refuses a process (or a CLI) of a schema generation
	// below the store's floor: it names the release the store needs.
	CodeTooOld = "too_old"
	// CodeVersionSkew refuses a fleet upgrade to a release the skew
	// policy does not allow: ahead of the control plane, or skipping a
	// minor release.
	CodeVersionSkew = "version_skew"
)

// Error is a structured failure: a code to act on, a message for people, and
// details naming the subject, key or machine involved.
type Error struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Detail  map[string]string `json:"detail,omitempty"`

	// cause is what the message wrapped with %w, for errors.Is and
	// errors.As in this process; it does not cross the wire.
	cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code)
	b.WriteString(": ")
	b.WriteString(e.Message)
	if len(e.Detail) > 0 {
		keys := make([]string, 0, len(e.Detail))
		for k := range e.Detail {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(" (")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s=%s", k, e.Detail[k])
		}
		b.WriteString(")")
	}
	return b.String()
}

// Errorf builds an *Error with code and a formatted message. As with
// fmt.Errorf, an error formatted with %w stays reachable through
// errors.Is and errors.As.
func Errorf(code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Message: err.Error()}
	switch err.(type) {
	case interface{ Unwrap() error }, interface{ Unwrap() []error }:
		e.cause = err
	}
	return e
}

// Unwrap returns the error the message wrapped, if any.
func (e *Error) Unwrap() error { return e.cause }

// With returns e with detail k=v added.
func (e *Error) With(k, v string) *Error {
	if e.Detail == nil {
		e.Detail = make(map[string]string)
	}
	e.Detail[k] = v
	return e
}

// AsError returns err as a structured *Error: itself if it is (or wraps) one,
// an RPCFailure's structured form, or an internal error carrying its text.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var se *Error
	if errors.As(err, &se) {
		return se
	}
	var rf *RPCFailure
	if errors.As(err, &rf) {
		return rf.Structured()
	}
	return &Error{Code: CodeInternal, Message: err.Error()}
}

// HasCode reports whether err carries the structured code.
func HasCode(err error, code string) bool {
	var se *Error
	if errors.As(err, &se) {
		return se.Code == code
	}
	var rf *RPCFailure
	return code == CodeRPCFailure && errors.As(err, &rf)
}

// RPC failure causes.
const (
	CauseNoResponders = "no_responders"
	CauseTimeout      = "timeout"
	CauseTransport    = "transport"
	CauseRemote       = "remote_error"
)

// RPCFailure is a request to a machine that got no usable answer: nobody
// listened, nobody answered in time, or the transport failed. It is never
// retried silently; the caller decides.
type RPCFailure struct {
	Machine string `json:"machine"`
	Command string `json:"command"`
	Cause   string `json:"cause"`
	Detail  string `json:"detail,omitempty"`
}

func (f *RPCFailure) Error() string {
	s := fmt.Sprintf("rpc %s to machine %s failed: %s", f.Command, f.Machine, f.Cause)
	if f.Detail != "" {
		s += ": " + f.Detail
	}
	return s
}

// Structured returns the failure as an *Error with code rpc_failure.
func (f *RPCFailure) Structured() *Error {
	e := &Error{Code: CodeRPCFailure, Message: f.Error()}
	e.With("machine", f.Machine).With("command", f.Command).With("cause", f.Cause)
	return e
}
