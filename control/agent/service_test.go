package agent

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// binaryNamed copies the binary src to a fresh dir as name and returns
// its path.
func binaryNamed(t *testing.T, src, name string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// startProc starts bin with args until the test ends; it returns the
// process and a channel closed when it exits.
func startProc(t *testing.T, bin string, args ...string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd, done
}

func writePidfile(t *testing.T, path string, pid int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// alive reports whether done has not closed within a moment.
func alive(done <-chan struct{}) bool {
	select {
	case <-done:
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
}

// The agent signals a service's process only when it is the service's:
// a pidfile naming another process (a sleep here, sshd on a real box)
// gets a clear refusal and the process lives on; so does a pidfile that
// is a link, and one naming a process of another user than its owner.
// The service's own process is signalled.
func TestPidfileNamingAnotherProcessIsNotSignalled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "meshd.pid")
	sv := service{what: "meshd", pidfile: pidfile, names: []string{"meshd"}, releases: upgrade.Dir(filepath.Join(dir, "releases"))}

	sleep, sleepDone := startProc(t, "sleep", "300")
	writePidfile(t, pidfile, sleep.Process.Pid)
	pid, err := sv.signal(ctx, syscall.SIGTERM)
	if !store.HasCode(err, store.CodeInvalid) || pid != 0 || !strings.Contains(err.Error(), "not the meshd") || !strings.Contains(err.Error(), "not signalled") {
		t.Fatalf("a pidfile naming a sleep: pid %d, %v", pid, err)
	}
	t.Logf("refused: %v", err)
	if !alive(sleepDone) {
		t.Fatal("the sleep was signalled")
	}

	// A link to another service's pidfile is not followed.
	other := filepath.Join(dir, "other.pid")
	writePidfile(t, other, sleep.Process.Pid)
	if err := os.Remove(pidfile); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, pidfile); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.signal(ctx, syscall.SIGTERM); !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "is a link") {
		t.Fatalf("a pidfile that is a link: %v", err)
	}
	if err := os.Remove(pidfile); err != nil {
		t.Fatal(err)
	}

	// The service's own binary, named in the pidfile: signalled.
	meshd, meshdDone := startProc(t, binaryNamed(t, "/bin/sleep", "meshd"), "300")
	writePidfile(t, pidfile, meshd.Process.Pid)
	if pid, err := sv.signal(ctx, syscall.SIGTERM); err != nil || pid != meshd.Process.Pid {
		t.Fatalf("the service's own process: pid %d, %v", pid, err)
	}
	select {
	case <-meshdDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the service's own process was not signalled")
	}
	// Gone, its pidfile is stale: nothing runs, nothing is signalled.
	if pid, err := sv.signal(ctx, syscall.SIGTERM); pid != 0 || err != nil {
		t.Fatalf("a stale pidfile: pid %d, %v", pid, err)
	}

	// A pidfile another user owns naming root's process, even one
	// running the service's binary: not signalled.
	if os.Geteuid() != 0 {
		t.Log("not root: the pidfile owner check is not tried")
		return
	}
	rootMeshd, rootDone := startProc(t, binaryNamed(t, "/bin/sleep", "meshd"), "300")
	writePidfile(t, pidfile, rootMeshd.Process.Pid)
	if err := os.Chown(pidfile, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := sv.signal(ctx, syscall.SIGTERM); !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "names only its owner's processes") {
		t.Fatalf("another user's pidfile naming root's process: %v", err)
	}
	if !alive(rootDone) {
		t.Fatal("root's process was signalled on another user's word")
	}
}

// An upgrade whose gateway pidfile names another process is refused
// before anything is signalled or linked: the process lives on, the
// gateway's release link is untouched, no trial begins.
func TestUpgradeRefusesAPidfileNamingAnotherProcess(t *testing.T) {
	runningVersion(t, "1.5.0")
	srv := storetest.Start(t)
	releases := upgrade.ForData(t.TempDir())
	gwReleases := upgrade.Dir(filepath.Join(t.TempDir(), "gw"))
	gwPidfile := filepath.Join(t.TempDir(), "gw.pid")
	startAgentAlone(t, srv, t.TempDir(), func(c *Config) {
		c.Releases, c.Self = releases, "/usr/bin/control"
		c.GatewayReleases, c.GatewayPidfile = gwReleases, gwPidfile
	})
	if err := srv.Store.PushRelease(context.Background(), &store.ReleaseRecord{Release: "1.8.0", Arch: version.Arch()},
		map[string]io.Reader{"control": script(`echo "control 1.8.0 (linux/amd64, go)"`), "caddy": script("exit 1")}); err != nil {
		t.Fatal(err)
	}
	sleep, done := startProc(t, "sleep", "300")
	writePidfile(t, gwPidfile, sleep.Process.Pid)
	err := upgradeCall(t, srv.Store, "1.8.0", 1)
	if se := store.AsError(err); se == nil || se.Code != store.CodeInvalid || !strings.Contains(se.Message, "not signalled") {
		t.Fatalf("an upgrade with a pidfile naming a sleep: %v", err)
	}
	if !alive(done) {
		t.Fatal("the sleep was signalled")
	}
	if cur, _ := gwReleases.Current(); cur != "" {
		t.Fatalf("the gateway's link was moved to %s", cur)
	}
	if tr, err := releases.Load(); err != nil || tr != nil {
		t.Fatalf("a trial was begun: %+v %v", tr, err)
	}
}
