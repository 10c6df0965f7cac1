// Package enginetest runs real container engines for the container
// driver's tests: podman's Docker-compatible service and a Docker daemon,
// each on a socket of its own with its own storage under a temporary dir,
// so that test processes running at the same time (go test ./... runs
// packages in parallel) never see each other's images or containers. It
// also builds small images from static binaries and runs a real registry
// on loopback (registry.go).
//
// The tests that use it need root. As root they run, never skip: a missing
// engine fails the test (scripts/test-deps.sh installs them, as CI does);
// without root they skip and say so.
package enginetest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The engines a test can ask for.
const (
	Podman = "podman"
	Docker = "docker"
)

// Names are the engines every container test runs against, in order.
var Names = []string{Podman, Docker}

// Engine is a running container engine that speaks the Docker Engine API.
type Engine struct {
	// Name is Podman or Docker.
	Name string
	// Host is the engine's address for an Engine API client
	// ("unix:///.../engine.sock").
	Host string
	// Env is what the engine's command line tool needs to reach this
	// engine and its storage.
	Env []string

	// cli is the command line tool and its leading arguments.
	cli []string
	// dir holds the engine's socket, configuration and storage.
	dir string
	// out is the engine's own output, shown when a test fails.
	out *syncBuffer
	// stop ends the engine's own process; set once it started.
	stop func() error
}

// Available says why the engines cannot be used here, or "" if they can.
// Only the lack of root is a reason to skip: as root, a missing engine is
// a failure.
func Available() string {
	if os.Geteuid() != 0 {
		return "container engine tests need root (CI runs them as root)"
	}
	return ""
}

// Run runs f as one subtest per engine (t.Run("podman"), t.Run("docker")),
// each with an engine of its own that stops when the subtest ends.
func Run(t *testing.T, f func(t *testing.T, e *Engine)) {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	for _, name := range Names {
		t.Run(name, func(t *testing.T) { f(t, Start(t, name)) })
	}
}

// Start runs the engine name until the test ends, or skips the test when
// it is not run as root. When the test ends every container the engine
// ran is removed, the engine is stopped and its storage deleted; a process
// of it left behind fails the test.
func Start(t testing.TB, name string) *Engine {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	dir, err := os.MkdirTemp("", "enginetest-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{Name: name, dir: dir, out: &syncBuffer{}}
	began := time.Now()
	switch name {
	case Podman:
		err = e.startPodman()
	case Docker:
		err = e.startDocker()
	default:
		err = fmt.Errorf("unknown engine %q", name)
	}
	if err != nil {
		e.cleanup(t)
		t.Fatalf("starting %s: %v\n%s", name, err, e.out.String())
	}
	t.Cleanup(func() { e.cleanup(t) })
	t.Logf("%s serving on %s after %s", name, e.Host, time.Since(began).Round(time.Millisecond))
	return e
}

// cleanup removes every container, stops the engine, makes sure nothing
// it started still runs, and deletes its dir.
func (e *Engine) cleanup(t testing.TB) {
	began := time.Now()
	defer func() {
		t.Logf("%s stopped and its storage removed in %s", e.Name, time.Since(began).Round(time.Millisecond))
	}()
	if e.cli != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if ids, err := e.CLI(ctx, "ps", "-a", "-q"); err == nil && ids != "" {
			if _, err := e.CLI(ctx, append([]string{"rm", "-f"}, strings.Fields(ids)...)...); err != nil {
				t.Errorf("removing %s's containers: %v", e.Name, err)
			}
		}
		cancel()
	}
	if e.stop != nil {
		if err := e.stop(); err != nil {
			t.Errorf("stopping %s: %v", e.Name, err)
		}
	}
	if t.Failed() {
		t.Logf("--- %s output (tail) ---\n%s", e.Name, tail(e.out.String(), 8<<10))
	}
	// podman runs each container's conmon and `podman container cleanup`
	// (its exit command) on their own after the container ends: they are
	// the engine finishing its work, not leftovers, unless they outlive a
	// generous wait.
	if left := waitGone(e.dir, 15*time.Second); len(left) > 0 {
		for _, p := range left {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		t.Errorf("%s left processes behind (killed now): %v", e.Name, left)
	}
	unmountUnder(e.dir)
	if err := os.RemoveAll(e.dir); err != nil {
		t.Errorf("removing %s's storage: %v", e.Name, err)
	}
}

// startDaemon starts cmd with its output kept and waits until the Engine
// API on sock answers a ping (dockerd accepts connections on its socket
// before it serves them); done closes when the process has ended.
func (e *Engine) startDaemon(cmd *exec.Cmd, sock string) (done <-chan struct{}, err error) {
	// Same process group as the test: a Ctrl-C that ends the test (and
	// its cleanups) stops the engine too, and dockerd then stops its
	// containers.
	cmd.Stdout, cmd.Stderr = e.out, e.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	go func() { _ = cmd.Wait(); close(ch) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ping(sock) {
			return ch, nil
		}
		select {
		case <-ch:
			return ch, fmt.Errorf("%s exited before it listened on %s", cmd.Path, sock)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return ch, fmt.Errorf("%s did not listen on %s within 30s", cmd.Path, sock)
		}
	}
}

// ping reports whether the Engine API on the unix socket sock answers.
func ping(sock string) bool {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://engine/_ping")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// terminate sends SIGTERM to pid and waits for done, then SIGKILL.
func terminate(pid int, done <-chan struct{}, grace time.Duration) error {
	select {
	case <-done:
		return nil // it already ended (the start failed)
	default:
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signalling %d: %w", pid, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-done
	return fmt.Errorf("process %d ignored SIGTERM for %s and was killed", pid, grace)
}

// CLI runs the engine's command line tool (podman, or docker -H the
// engine's socket) against this engine and returns its trimmed output.
func (e *Engine) CLI(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.cli[0], append(slices.Clone(e.cli[1:]), args...)...)
	cmd.Env = e.Env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s%s", e.Name, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return strings.TrimSpace(stdout.String()), nil
}

// BuildImage builds tag FROM scratch with the static binary bin as its
// entrypoint (/app) and extra Dockerfile lines, and returns its image ID
// ("sha256:..."). The image goes with the engine's storage.
func (e *Engine) BuildImage(t testing.TB, tag, bin string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	df := "FROM scratch\nCOPY app /app\nENTRYPOINT [\"/app\"]\n" + strings.Join(extra, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.CLI(ctx, "build", "-q", "-t", tag, "-f", filepath.Join(dir, "Dockerfile"), dir); err != nil {
		t.Fatal(err)
	}
	id, err := e.CLI(ctx, "image", "inspect", "--format", "{{.Id}}", tag)
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + strings.TrimPrefix(id, "sha256:")
}

// BuildStatic builds the Go package pkg as a static binary (for a FROM
// scratch image) into dir and returns its path.
func BuildStatic(t testing.TB, pkg, dir string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	return out
}

// need finds a binary the engine needs, or says how to get it.
func need(bin, pkg string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s is not installed (scripts/test-deps.sh installs %s as root)", bin, pkg)
	}
	return p, nil
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// syncBuffer is an engine's output, written by its process while a test
// may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
