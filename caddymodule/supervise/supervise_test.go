package supervise

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer collects the children's output for the test to read.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A swap to a binary that does not serve in time, or that exits, is
// abandoned: the running child keeps serving (same PID), the outcome says
// why; a swap to one that serves replaces the child.
func TestSwapKeepsTheOldChildUnlessTheNewOneServes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serves := write("serves", `echo '{"msg":"serving initial configuration"}' >&2; exec sleep 60`)
	silent := write("silent", `exec sleep 60`)
	exits := write("exits", `echo boom >&2; exit 3`)
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"apps":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "current")
	point := func(target string) {
		t.Helper()
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	point(serves)
	out := &lockedBuffer{}
	s := &Supervisor{Binary: link, Args: []string{"run", "--config", cfg}, ReadyTimeout: 500 * time.Millisecond,
		StopTimeout: 5 * time.Second, Out: out, SwapFile: filepath.Join(dir, "swap")}
	ctx, cancel := context.WithCancel(context.Background())
	swap := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, swap) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	outcome := func() string {
		t.Helper()
		_ = os.Remove(s.SwapFile)
		swap <- struct{}{}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if b, err := os.ReadFile(s.SwapFile); err == nil && len(b) > 0 {
				return strings.TrimSpace(string(b))
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no swap outcome:\n%s", out.String())
		return ""
	}
	started := func() []string {
		var pids []string
		for _, l := range strings.Split(out.String(), "\n") {
			if _, rest, ok := strings.Cut(l, "supervise: started "); ok {
				pids = append(pids, rest)
			}
		}
		return pids
	}
	var first []string
	for deadline := time.Now().Add(5 * time.Second); len(first) == 0; first = started() {
		if time.Now().After(deadline) {
			t.Fatalf("no child started:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, bad := range []struct{ bin, why string }{{silent, "did not serve within 500ms"}, {exits, "exited before it served"}} {
		point(bad.bin)
		if got := outcome(); !strings.HasPrefix(got, "failed "+bad.bin) || !strings.Contains(got, bad.why) {
			t.Fatalf("swap to %s: %q", bad.bin, got)
		}
	}
	// The first child still runs: nothing stopped it.
	m := regexp.MustCompile(`\(pid (\d+)\)`).FindStringSubmatch(first[0])
	if m == nil {
		t.Fatalf("no pid in %q", first[0])
	}
	pid, _ := strconv.Atoi(m[1])
	if syscall.Kill(pid, 0) != nil {
		t.Fatalf("the serving child %q is gone after the failed swaps:\n%s", first[0], out.String())
	}
	point(serves)
	if got := outcome(); got != "ok "+serves {
		t.Fatalf("swap to a serving binary: %q", got)
	}
	if syscall.Kill(pid, 0) == nil {
		// Stopped children are reaped by the supervisor: a kill(0) on a
		// reaped PID fails.
		t.Fatalf("the old child %d still runs after a good swap", pid)
	}
}
