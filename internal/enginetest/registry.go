package enginetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Registry is a real image registry (Debian's docker-registry,
// distribution 2.8) on loopback, over plain HTTP, its storage in a
// temporary dir. Engines pull from it without TLS: Docker treats
// 127.0.0.0/8 as insecure by default, and podman through the
// registries.conf Start gives it.
type Registry struct {
	// Addr is "127.0.0.1:PORT": images in it are Addr+"/name:tag" or
	// Addr+"/name@sha256:...".
	Addr string
}

const registryConf = `version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  delete:
    enabled: true
http:
  addr: %s
`

// StartRegistry runs a registry on a loopback port of its own until the
// test ends, or skips the test when it is not run as root (the tests that
// push to it need an engine). As root a missing docker-registry fails.
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	bin, err := need("docker-registry", "docker-registry")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// A port picked by listening on :0 may be taken again before the
	// registry binds it: try another then.
	var out syncBuffer
	began := time.Now()
	for attempt := 0; ; attempt++ {
		addr := freeAddr(t)
		conf := filepath.Join(dir, "config.yml")
		if err := os.WriteFile(conf, []byte(fmt.Sprintf(registryConf, filepath.Join(dir, "data"), addr)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "serve", conf)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting docker-registry: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			if err := terminate(cmd.Process.Pid, done, 10*time.Second); err != nil {
				t.Errorf("stopping docker-registry: %v", err)
			}
			if t.Failed() {
				t.Logf("--- docker-registry output (tail) ---\n%s", tail(out.String(), 8<<10))
			}
		})
		err := waitRegistry(addr, done)
		if err == nil {
			t.Logf("docker-registry serving on %s after %s", addr, time.Since(began).Round(time.Millisecond))
			return &Registry{Addr: addr}
		}
		if attempt == 2 {
			t.Fatalf("docker-registry on %s: %v\n%s", addr, err, out.String())
		}
	}
}

// waitRegistry waits until the registry at addr answers its API root.
func waitRegistry(addr string, done <-chan struct{}) error {
	c := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err := c.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("it exited")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not answer within 20s")
		}
	}
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Push pushes image (a tag or ID the engine has) to ref (a registry's
// Addr+"/name:tag") and returns the digest of the manifest the registry
// now serves ("sha256:...").
func (e *Engine) Push(t testing.TB, image, ref string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch e.Name {
	case Podman:
		file := filepath.Join(t.TempDir(), "digest")
		if _, err := e.CLI(ctx, "push", "--digestfile", file, image, ref); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	default:
		if _, err := e.CLI(ctx, "tag", image, ref); err != nil {
			t.Fatal(err)
		}
		if _, err := e.CLI(ctx, "push", ref); err != nil {
			t.Fatal(err)
		}
		// Docker records what the registry answered as a repo digest.
		out, err := e.CLI(ctx, "image", "inspect", "--format", "{{json .RepoDigests}}", ref)
		if err != nil {
			t.Fatal(err)
		}
		var digests []string
		if err := json.Unmarshal([]byte(out), &digests); err != nil {
			t.Fatalf("repo digests of %s: %q: %v", ref, out, err)
		}
		repo := ref
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			repo = ref[:i]
		}
		repo += "@"
		for _, d := range digests {
			if strings.HasPrefix(d, repo) {
				return strings.TrimPrefix(d, repo)
			}
		}
		t.Fatalf("docker pushed %s but has no digest for it: %v", ref, digests)
		return ""
	}
}
