package integration

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tcpMigrateReq sets net.ipv4.tcp_migrate_req for the test (restored
// after), so connections queued on a closing SO_REUSEPORT listener move to
// the new one instead of being reset. Without root it is left as it is
// and the test says so.
func tcpMigrateReq(t *testing.T) string {
	t.Helper()
	const path = "/proc/sys/net/ipv4/tcp_migrate_req"
	old, err := os.ReadFile(path)
	if err != nil {
		return "unavailable: " + err.Error()
	}
	if os.Geteuid() != 0 {
		return strings.TrimSpace(string(old)) + " (not root: left as is)"
	}
	if os.Getenv("EDGEPLANE_KEEP_TCP_MIGRATE_REQ") != "" {
		// To measure what the sysctl buys: the machine's own setting.
		return strings.TrimSpace(string(old)) + " (kept)"
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(path, old, 0o644) })
	return "1"
}

// The gateway, run by `caddy supervise`, swaps itself for a new process of
// a new binary under load: the new one starts beside the old on the same
// ports, serves, and the old one stops gracefully. Not one request fails,
// across several swaps; a new binary that cannot start leaves the old one
// serving.
func TestGatewaySwapsBinaryUnderLoadDroppingNothing(t *testing.T) {
	migrate := tcpMigrateReq(t)
	c := newCluster(t)
	c.join("m1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", gwV1), "--drain-grace", "200ms")

	// Two binaries: the installed one and a release's copy, each named by
	// the link supervise resolves at every swap.
	rel := t.TempDir()
	next := filepath.Join(rel, "caddy-next")
	copyFile(t, bins.caddy, next)
	link := filepath.Join(rel, "current")
	point := func(target string) {
		t.Helper()
		_ = os.Remove(link + ".tmp")
		if err := os.Symlink(target, link+".tmp"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(link+".tmp", link); err != nil {
			t.Fatal(err)
		}
	}
	point(bins.caddy)

	g, cfg, env := c.gatewayConfig("gw1", map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	pidfile := filepath.Join(g.dir, "supervise.pid")
	g.proc = start(t, "caddy supervise", env, bins.caddy, "supervise", "--config", cfg, "--binary", link, "--pidfile", pidfile, "--ready-timeout", "20s")
	g.waitConnected(t, "gw1")
	supervisorPID := g.proc.cmd.Process.Pid

	swap := func(want string) {
		t.Helper()
		_ = os.Remove(pidfile + ".swap")
		if err := syscall.Kill(supervisorPID, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(40 * time.Second)
		for {
			b, _ := os.ReadFile(pidfile + ".swap")
			if s := string(b); s != "" {
				if !strings.HasPrefix(s, want) {
					t.Fatalf("swap: %q, want %q...\n%s", s, want, g.proc.output())
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no swap outcome within 40 s:\n%s", g.proc.output())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	stop := make(chan struct{})
	l, wg := g.runLoad("shop.example.com", 8, stop)
	w := startWrk(t, g.http, "shop.example.com")
	start := time.Now()
	for i, target := range []string{next, bins.caddy, next} {
		point(target)
		swap("ok " + target)
		// The gateway answers from a child of the new binary.
		if exe := childBinary(t, supervisorPID); exe != target {
			t.Fatalf("swap %d: the child runs %s, want %s", i+1, exe, target)
		}
		time.Sleep(300 * time.Millisecond) // the load goes on across the old child's stop
	}
	// A binary that cannot serve: the old child keeps serving.
	point("/bin/false")
	swap("failed ")
	if exe := childBinary(t, supervisorPID); exe != next {
		t.Fatalf("after a failed swap the child runs %s, want %s", exe, next)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	res := w.stop(t)
	t.Logf("gateway swapped 3 times (and refused one bad binary) in %s under load (tcp_migrate_req %s): Go clients %d requests, %d failed; wrk %s",
		time.Since(start).Round(time.Millisecond), migrate, l.ok.Load(), l.failed.Load(), res)
	if l.failed.Load() != 0 || l.ok.Load() < 100 {
		t.Fatalf("swaps under load: %d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.errs)
	}
	if res.requests < 100 || res.non2xx != 0 || res.socketErrors != 0 {
		t.Fatalf("swaps under wrk: %s\n%s", res, res.out)
	}
}

// childBinary is the binary of the supervisor's one child process.
func childBinary(t *testing.T, ppid int) string {
	t.Helper()
	// Children of any of its threads: /proc/*/stat names the parent.
	var kids []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			kids = append(kids, p.Name())
		}
	}
	if len(kids) != 1 {
		t.Fatalf("supervisor %d has children %v, want one", ppid, kids)
	}
	exe, err := os.Readlink("/proc/" + kids[0] + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
