package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/enginetest"
)

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func get(port int) (string, error) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The container driver against real podman and real Docker: an image
// resolved to its ID and pinned, the instance's environment, adoption by a
// second driver (same container), a kill -9 seen as an exit, the labels
// that find strays, a retagged image that does not change what a pinned
// start runs, and a removed image refused by ID.
func TestContainerDriver(t *testing.T) {
	if why := enginetest.Available(); why != "" {
		t.Skip(why)
	}
	hello := enginetest.BuildStatic(t, "github.com/edgeplane/edgeplane/examples/hello", t.TempDir())
	enginetest.Run(t, func(t *testing.T, e *enginetest.Engine) { testContainerDriver(t, e, hello) })
}

func testContainerDriver(t *testing.T, e *enginetest.Engine, hello string) {
	ctx := context.Background()
	v1 := e.BuildImage(t, "localhost/edgeplane-rt-hello:v1", hello, `ENV VERSION=1`)
	d, err := runtime.ConnectEngine(ctx, e.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("Engine API version negotiated with %s: %s", e.Name, d.APIVersion)

	img, err := d.ResolveImage(ctx, "localhost/edgeplane-rt-hello:v1")
	if err != nil || img.ID != v1 {
		t.Fatalf("resolve: %+v %v, want %s", img, err, v1)
	}
	// The tag moves to another image; the pinned ID still starts v1.
	v2 := e.BuildImage(t, "localhost/edgeplane-rt-hello:v1", hello, `ENV VERSION=2`)
	if moved, _ := d.ResolveImage(ctx, "localhost/edgeplane-rt-hello:v1"); moved == nil || moved.ID == v1 {
		t.Fatalf("the tag did not move: %+v", moved)
	}
	// Many at once (every agent of an apply on one engine) share lookups
	// and each sees the tag where it is now; moved back, it is seen back.
	resolveAll := func(want string) {
		t.Helper()
		errs := make(chan error, 10)
		for range 10 {
			go func() {
				img, err := d.ResolveImage(ctx, "localhost/edgeplane-rt-hello:v1")
				if err == nil && img.ID != want {
					err = fmt.Errorf("resolved to %s, want %s", img.ID, want)
				}
				errs <- err
			}()
		}
		for range 10 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	resolveAll(v2)
	if _, err := e.CLI(ctx, "tag", v1, "localhost/edgeplane-rt-hello:v1"); err != nil {
		t.Fatal(err)
	}
	resolveAll(v1)
	port := freePort(t)
	id := fmt.Sprintf("rt-%d", time.Now().UnixNano())
	logDir := t.TempDir()
	h, err := d.Start(ctx, runtime.Spec{ID: id, Image: v1, Host: "127.0.0.1", Port: port, ReadOnlyRoot: true, Memory: 64 << 20, LogDir: logDir,
		Env: map[string]string{"EDGEPLANE_SERVICE": "web"}, Labels: map[string]string{runtime.LabelNamespace: "shop"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background(), h, time.Second) })
	eventually(t, "the container to answer", func() bool { _, err := get(port); return err == nil })
	if body, _ := get(port); body == "" {
		t.Fatal("empty answer")
	}
	st := h.State()
	if st.Container == "" || st.PID <= 0 || st.Driver != "container" || st.LogPath != filepath.Join(logDir, id+".log") {
		t.Fatalf("state: %+v", st)
	}
	// Its output lands in the log file, as a process's does.
	eventually(t, "the container's output in its log file", func() bool {
		b, _ := os.ReadFile(st.LogPath)
		return strings.Contains(string(b), fmt.Sprintf("hello listening on 127.0.0.1:%d", port))
	})

	// A second driver (a restarted agent) adopts the same container.
	d2, err := runtime.ConnectEngine(ctx, e.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	h2, err := d2.Adopt(ctx, st)
	if err != nil || h2.State().Container != st.Container {
		t.Fatalf("adopt: %+v %v", h2, err)
	}
	list, err := d2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		if l.Instance == id && l.Container == st.Container && l.Running && l.Labels[runtime.LabelNamespace] == "shop" {
			found = true
		}
	}
	if !found {
		t.Fatalf("list does not show %s: %+v", id, list)
	}

	// kill -9 of its process is an exit both handles see.
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, hh := range []runtime.Handle{h, h2} {
		select {
		case <-hh.Exited():
		case <-time.After(10 * time.Second):
			t.Fatal("the killed container's exit was not seen")
		}
		if got := hh.ExitErr().Error(); got != "killed by signal killed" {
			t.Fatalf("exit: %q", got)
		}
	}
	if _, err := d2.Adopt(ctx, st); !errors.Is(err, runtime.ErrGone) {
		t.Fatalf("adopting a dead container: %v", err)
	}
	// Started again (same name), then stopped: the container is removed.
	h3, err := d.Start(ctx, runtime.Spec{ID: id, Image: v1, Host: "127.0.0.1", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted container to answer", func() bool { _, err := get(port); return err == nil })
	if err := d.Stop(ctx, h3, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// The run has ended, and how, when Stop returns (not once the
	// engine's wait answers too).
	var exit *runtime.Exit
	if !errors.As(h3.ExitErr(), &exit) || !exit.Known {
		t.Fatalf("after Stop the handle says %v, want a known exit", h3.ExitErr())
	}
	if _, err := d.Adopt(ctx, h3.State()); !errors.Is(err, runtime.ErrGone) {
		t.Fatalf("a stopped container is still there: %v", err)
	}

	// An image removed from the store cannot be resolved or started by ID.
	if _, err := e.CLI(ctx, "rmi", "-f", v1); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ResolveImage(ctx, v1); !errors.Is(err, runtime.ErrNoImage) {
		t.Fatalf("resolving a removed image: %v", err)
	}
	if _, err := d.Start(ctx, runtime.Spec{ID: id + "-x", Image: v1, Host: "127.0.0.1", Port: port}); !errors.Is(err, runtime.ErrNoImage) {
		t.Fatalf("starting a removed image: %v", err)
	}
}

// BenchmarkStartToReady measures an instance's start until it answers
// HTTP, on each engine: through the container driver, and the engine's
// own `run -d` of the same image by hand (cli-run), in the same process
// (the ratio is the figure; the machine is noisy).
func BenchmarkStartToReady(b *testing.B) {
	if why := enginetest.Available(); why != "" {
		b.Skip(why)
	}
	hello := enginetest.BuildStatic(b, "github.com/edgeplane/edgeplane/examples/hello", b.TempDir())
	for _, name := range enginetest.Names {
		b.Run(name, func(b *testing.B) { benchStartToReady(b, enginetest.Start(b, name), hello) })
	}
}

func benchStartToReady(b *testing.B, e *enginetest.Engine, hello string) {
	ctx := context.Background()
	img := e.BuildImage(b, "localhost/edgeplane-bench-rt:v1", hello)
	d, err := runtime.ConnectEngine(ctx, e.Host)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ready := func(port int) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := get(port); err == nil {
				return
			}
			if time.Now().After(deadline) {
				b.Fatal("never answered")
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	b.Run("driver", func(b *testing.B) {
		for i := range b.N {
			port := freePort(b)
			h, err := d.Start(ctx, runtime.Spec{ID: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i), Image: img, Host: "127.0.0.1", Port: port})
			if err != nil {
				b.Fatal(err)
			}
			ready(port)
			b.StopTimer()
			_ = d.Stop(ctx, h, time.Second)
			b.StartTimer()
		}
	})
	rm := []string{"rm", "-f"}
	if e.Name == enginetest.Podman {
		rm = append(rm, "-t", "1") // podman's rm -f waits 10s for SIGTERM by default
	}
	b.Run("cli-run", func(b *testing.B) {
		for i := range b.N {
			port := freePort(b)
			name := fmt.Sprintf("bench-run-%d-%d", time.Now().UnixNano(), i)
			if _, err := e.CLI(ctx, "run", "-d", "--network", "host", "--name", name, "-e", "HOST=127.0.0.1", "-e", fmt.Sprintf("PORT=%d", port), img); err != nil {
				b.Fatal(err)
			}
			ready(port)
			b.StopTimer()
			_, _ = e.CLI(ctx, append(rm, name)...)
			b.StartTimer()
		}
	})
}
