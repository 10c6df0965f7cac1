package logs

import (
	"bytes"
	"errors"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// Output arrives in chunks cut anywhere: only whole lines are printed, a
// line's end waits for its next chunk, and the prefix names the instance
// once there are several.
func TestLinesAreAssembledAcrossChunks(t *testing.T) {
	var out bytes.Buffer
	tl := &tail{w: &out, cursors: map[string]*cursor{}}
	a := &cursor{rec: store.InstanceRecord{ID: "a"}}
	tl.cursors["a"] = a
	tl.print(a, []byte("one\ntw"))
	tl.print(a, []byte("o\nthr"))
	if got := out.String(); got != "one\ntwo\n" {
		t.Fatalf("one instance: %q", got)
	}
	b := &cursor{rec: store.InstanceRecord{ID: "b"}}
	tl.cursors["b"] = b
	tl.print(b, []byte("x\n"))
	tl.flush()
	if got, want := out.String(), "one\ntwo\n[b] x\n[a] thr\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// A machine that does not answer is named once per instance and cause, not
// on every poll.
func TestUnavailableOutputIsNamedOnce(t *testing.T) {
	var out bytes.Buffer
	tl := &tail{w: &out, cursors: map[string]*cursor{}}
	rpc := &store.RPCFailure{Machine: "m1", Command: store.CmdLogs, Cause: store.CauseTimeout}
	for range 3 {
		tl.warn("a", rpc)
	}
	tl.warn("a", errors.New("disk gone"))
	if got, want := out.String(), "[a] (output unavailable: "+rpc.Error()+")\n[a] (output unavailable: disk gone)\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
