package certs_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

// The test binary doubles as the helper processes the lock and end-to-end
// tests kill: EDGEPLANE_CERTS_HELPER selects the role.
func TestMain(m *testing.M) {
	switch os.Getenv("EDGEPLANE_CERTS_HELPER") {
	case "":
		os.Exit(m.Run())
	case "locker":
		os.Exit(lockerMain())
	case "gateway":
		os.Exit(gatewayMain())
	default:
		fmt.Fprintln(os.Stderr, "unknown helper role")
		os.Exit(2)
	}
}

func helperStore(ctx context.Context) (*store.Store, error) {
	nc, err := store.Connect(store.ConnectOptions{URL: os.Getenv("EP_NATS"), Name: os.Getenv("EP_NAME")})
	if err != nil {
		return nil, err
	}
	names, _ := store.NewNames("", "")
	return store.Open(ctx, nc, names)
}

// lockerMain holds locks on command from stdin: "lock <name>", "store <key>
// <value>", "unlock <name>", "renew <name>". Each answers one line "OK ..."
// or "ERR <error>".
func lockerMain() int {
	ctx := context.Background()
	st, err := helperStore(ctx)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	ttl, _ := time.ParseDuration(os.Getenv("EP_LOCK_TTL"))
	s, err := certs.New(store.Bound(st), certs.Options{LockTTL: ttl, Holder: os.Getenv("EP_NAME")})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("READY")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 3)
		var err error
		switch f[0] {
		case "lock":
			err = s.Lock(ctx, f[1])
		case "unlock":
			err = s.Unlock(ctx, f[1])
		case "renew":
			err = s.RenewLockLease(ctx, f[1], time.Minute)
		case "store":
			err = s.Store(ctx, f[1], []byte(f[2]))
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		if err != nil {
			fmt.Println("ERR", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Println("OK", f[0])
		}
	}
	return 0
}

// helper is a running helper process of the test binary.
type helper struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	once  sync.Once
	done  chan struct{}
	ready string // the READY line
}

func startHelper(t testing.TB, role, name string, env ...string) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"EDGEPLANE_CERTS_HELPER=" + role, "EP_NAME=" + name}, env...)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	logf, err := os.Create(fmt.Sprintf("%s/%s.stderr", t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{t: t, name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	go func() {
		_ = cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		h.kill()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil && len(b) > 0 {
				t.Logf("%s stderr (tail):\n%s", name, tail(string(b), 4000))
			}
		}
	})
	h.ready = h.expect("READY", 30*time.Second)
	return h
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (h *helper) send(line string) {
	h.t.Helper()
	if _, err := fmt.Fprintln(h.stdin, line); err != nil {
		h.t.Fatalf("%s: sending %q: %v", h.name, line, err)
	}
}

// next returns the helper's next output line.
func (h *helper) next(timeout time.Duration) string {
	h.t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			h.t.Fatalf("%s exited", h.name)
		}
		return l
	case <-time.After(timeout):
		h.t.Fatalf("%s: no answer within %s", h.name, timeout)
	}
	return ""
}

// expect waits for a line starting with prefix, skipping others.
func (h *helper) expect(prefix string, timeout time.Duration) string {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := h.next(time.Until(deadline))
		if strings.HasPrefix(l, prefix) {
			return l
		}
		if strings.HasPrefix(l, "ERR") && !strings.HasPrefix(prefix, "ERR") {
			h.t.Fatalf("%s: waiting for %q got %q", h.name, prefix, l)
		}
	}
}

// do sends a command and returns its answer line.
func (h *helper) do(line string, timeout time.Duration) string {
	h.t.Helper()
	h.send(line)
	return h.next(timeout)
}

func (h *helper) kill() {
	h.once.Do(func() {
		_ = h.cmd.Process.Kill() // SIGKILL: no cleanup, no unlock
		<-h.done
	})
}
