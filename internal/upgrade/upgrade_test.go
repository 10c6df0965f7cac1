package upgrade

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func stage(t *testing.T, d Dir, ver string) string {
	t.Helper()
	p, err := d.Stage(ver, "control", func(w io.Writer) error {
		_, err := io.WriteString(w, "#!/bin/sh\necho control "+ver+"\n")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The starts of an agent as a supervisor makes them: the installed binary
// follows current; a release on trial that starts a second time without
// passing its gate is rolled back; a confirmed one stays.
func TestLaunchFollowsCurrentAndRollsBackASecondStart(t *testing.T) {
	data := t.TempDir()
	installed := filepath.Join(t.TempDir(), "control")
	if err := os.WriteFile(installed, []byte("installed"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := ForData(data)
	if next, tr, err := d.Launch(installed, false); err != nil || next != "" || tr != nil {
		t.Fatalf("fresh machine: %q %v %v", next, tr, err)
	}
	v2 := stage(t, d, "1.1.0")
	if fi, err := os.Stat(v2); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("staged binary: %v %v", fi, err)
	}
	tr := &Trial{From: "1.0.0", FromPath: installed, To: "1.1.0", ToPath: v2, Started: time.Now(), Deadline: time.Now().Add(time.Minute)}
	if err := d.Begin(tr); err != nil {
		t.Fatal(err)
	}
	// The upgrade execs v2 directly: its first start.
	if next, tr, err := d.Launch(v2, false); err != nil || next != "" || tr.Boots != 1 || tr.State != StateTrial {
		t.Fatalf("first start of the trial: %q %+v %v", next, tr, err)
	}
	// It died; the supervisor starts the installed binary again.
	next, tr, err := d.Launch(installed, false)
	if err != nil || next != "" || tr.State != StateRolledBack || !strings.Contains(tr.Reason, "start 2") {
		t.Fatalf("second start: %q %+v %v", next, tr, err)
	}
	if cur, _ := d.Current(); cur != "" {
		t.Fatalf("after rolling back to the installed binary, current is %q", cur)
	}

	// A second upgrade, confirmed: the installed binary execs it at every
	// start, and the exec'd process does not count a start.
	v3 := stage(t, d, "1.2.0")
	tr = &Trial{From: "1.0.0", FromPath: installed, To: "1.2.0", ToPath: v3}
	if err := d.Begin(tr); err != nil {
		t.Fatal(err)
	}
	if next, _, _ := d.Launch(installed, false); next != v3 {
		t.Fatalf("installed binary should exec %s, got %q", v3, next)
	}
	if next, tr, _ := d.Launch(v3, true); next != "" || tr.Boots != 1 {
		t.Fatalf("launched start counted again: %q %+v", next, tr)
	}
	if err := d.Confirm(tr); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if next, tr, _ := d.Launch(installed, false); next != v3 || tr.State != StateConfirmed {
			t.Fatalf("restart %d of a confirmed release: %q %+v", i, next, tr)
		}
	}
	// A third, rolled back by its gate: back to 1.2.0 in the release dir.
	v4 := stage(t, d, "1.3.0")
	tr = &Trial{From: "1.2.0", FromPath: v3, To: "1.3.0", ToPath: v4}
	if err := d.Begin(tr); err != nil {
		t.Fatal(err)
	}
	prev, err := d.RollBack(tr, "does not answer")
	if err != nil || prev != v3 {
		t.Fatalf("rollback: %q %v", prev, err)
	}
	if cur, _ := d.Current(); cur != v3 {
		t.Fatalf("current after the rollback: %q", cur)
	}
}

// A fetch that fails leaves nothing staged: no half-written binary.
func TestStageKeepsNothingOfAFailedFetch(t *testing.T) {
	d := ForData(t.TempDir())
	_, err := d.Stage("1.1.0", "control", func(w io.Writer) error {
		w.Write(bytes.Repeat([]byte("x"), 1000))
		return errors.New("digest mismatch")
	})
	if err == nil {
		t.Fatal("a failed fetch staged")
	}
	if _, err := os.Stat(d.BinaryPath("1.1.0", "control")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("staged binary after a failed fetch: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(d.BinaryPath("1.1.0", "control")))
	if len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
}
