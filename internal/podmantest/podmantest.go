// Package podmantest runs podman's Docker-compatible API service on a
// socket of the test's own, configured the way these machines need it
// (runtime runc, no default rlimits; see scripts/test-deps.sh), and builds
// small images from static binaries. Tests that use it need root and
// podman; without them they skip and say why (CI installs podman and runs
// as root, so it never skips there).
package podmantest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// containersConf is what podman needs on these machines: crun refuses the
// kernel's hybrid cgroups, and the sandbox refuses podman's default
// rlimits.
const containersConf = `[containers]
default_ulimits = []

[engine]
runtime = "runc"
`

// Engine is a running podman API service.
type Engine struct {
	// Host is the service's address for an Engine API client
	// ("unix:///.../podman.sock").
	Host string
	// Env is what a podman command (or an agent that starts one) needs.
	Env []string
}

// Available says why podman cannot be used here, or "" if it can.
func Available() string {
	if os.Geteuid() != 0 {
		return "podman tests need root (CI runs them as root)"
	}
	if _, err := exec.LookPath("podman"); err != nil {
		return "podman is not installed (scripts/test-deps.sh installs it as root)"
	}
	return ""
}

// Start runs `podman system service` on a socket in a temporary dir until
// the test ends, or skips the test when podman cannot run here.
func Start(t testing.TB) *Engine {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	dir, err := os.MkdirTemp("", "podmantest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(conf, []byte(containersConf), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "podman.sock")
	e := &Engine{Host: "unix://" + sock, Env: append(os.Environ(), "CONTAINERS_CONF="+conf)}
	cmd := exec.Command("podman", "system", "service", "--time=0", e.Host)
	cmd.Env = e.Env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting podman system service: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return e
		}
		select {
		case <-done:
			t.Fatalf("podman system service exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("podman system service did not listen on %s:\n%s", sock, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Podman runs a podman command with the engine's configuration.
func (e *Engine) Podman(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = e.Env
	b, err := cmd.CombinedOutput()
	if err != nil {
		return string(b), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, b)
	}
	return strings.TrimSpace(string(b)), nil
}

// BuildImage builds tag FROM scratch with the static binary bin as its
// entrypoint (/app) and extra Containerfile lines, and returns its image
// ID. The image is removed when the test ends.
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
	cf := "FROM scratch\nCOPY app /app\nENTRYPOINT [\"/app\"]\n" + strings.Join(extra, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Containerfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.Podman(ctx, "build", "-q", "-t", tag, dir); err != nil {
		t.Fatal(err)
	}
	id, err := e.Podman(ctx, "image", "inspect", "--format", "{{.Id}}", tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = e.Podman(ctx, "rmi", "-f", id)
	})
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
