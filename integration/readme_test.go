package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestReadmeUp runs the README's first command the way `make up` does
// (scripts/up.sh, here with --once and free ports) and checks that it shows
// the sample app answering through the gateway and DNS, then stops cleanly.
func TestReadmeUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := upCommand(ctx, t, t.TempDir(), "--once")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/up.sh --once: %v\n%s", err, out)
	}
	text := string(out)
	if n := strings.Count(text, "hello from hello.demo slot"); n != 4 {
		t.Fatalf("want 4 answers of the sample app through the gateway, got %d:\n%s", n, text)
	}
	if _, err := exec.LookPath("dig"); err == nil && !strings.Contains(text, "\n127.0.0.1\n") {
		t.Fatalf("DNS did not answer with the instances' address:\n%s", text)
	}
	if !strings.Contains(text, "dashboard: http://127.0.0.1:") {
		t.Fatalf("the dashboard did not answer:\n%s", text)
	}
	if !strings.Contains(text, "==> stopped") {
		t.Fatalf("the demo did not stop cleanly:\n%s", text)
	}
}

// upCommand is scripts/up.sh with its data in data and free ports.
func upCommand(ctx context.Context, t *testing.T, data string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("scripts/up.sh needs curl (make test installs it as root)")
	}
	port := func() string {
		_, p, _ := net.SplitHostPort(freeAddr(t))
		return p
	}
	cmd := exec.CommandContext(ctx, "../scripts/up.sh", args...)
	cmd.Env = append(os.Environ(), "BIN="+bins.dir, "EDGEPLANE_DATA="+data,
		"UP_NATS_PORT="+port(), "UP_HTTP_PORT="+port(), "UP_HTTPS_PORT="+port(), "UP_ADMIN_PORT="+port(),
		"UP_DNS_PORT="+port(), "UP_STUN_PORT="+port(), "UP_DASHBOARD_PORT="+port())
	return cmd
}

// Ctrl-C in the terminal that runs `make up` (SIGINT to its whole
// foreground process group) stops the appliance and leaves no instance of
// the demo running: the control server and gateway are out of that group,
// so the script removes the demo through them before stopping them.
func TestReadmeUpStopsOnCtrlC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	data := t.TempDir()
	cmd := upCommand(ctx, t, data)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the appliance to run", func() bool { return strings.Contains(out.String(), "running; Ctrl-C") })
	pids := recordedPIDs(filepath.Join(data, "control", "agent", "instances", "*.json"))
	if len(pids) != 2 {
		t.Fatalf("want the demo's 2 instances recorded, found %v\n%s", pids, out.String())
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !strings.Contains(out.String(), "==> stopped") {
		t.Fatalf("no clean stop:\n%s", out.String())
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("instance pid %d still runs after Ctrl-C", pid)
		}
	}
}

// syncBuffer is a bytes.Buffer a process writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
