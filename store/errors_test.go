package store

import (
	"encoding/json"
	"errors"
	"io/fs"
	"testing"
)

// A structured error keeps what it wrapped for errors.Is and errors.As, and
// sends only its code, message and detail across the wire.
func TestErrorfKeepsTheCause(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
	err := Errorf(CodeInvalid, "reading credentials: %w", cause).With("file", "/x")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe != cause {
		t.Errorf("errors.As found %v, want the wrapped *fs.PathError", pe)
	}
	if !HasCode(err, CodeInvalid) {
		t.Errorf("HasCode(%v, invalid) = false", err)
	}
	b, _ := json.Marshal(err)
	if want := `{"code":"invalid","message":"reading credentials: open /x: file does not exist","detail":{"file":"/x"}}`; string(b) != want {
		t.Errorf("wire form %s, want %s", b, want)
	}
	if plain := Errorf(CodeInvalid, "no cause: %v", cause); errors.Unwrap(plain) != nil {
		t.Errorf("%%v wrapped %v", errors.Unwrap(plain))
	}
}
