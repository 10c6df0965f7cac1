package agent

import (
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
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

// runningVersion makes this test's agent report v (the test binary is
// "dev", older than any release).
func runningVersion(t *testing.T, v string) {
	old := version.Version
	version.Version = v
	t.Cleanup(func() { version.Version = old })
}

func upgradeCall(t *testing.T, s *store.Store, release string, attempt int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rep store.UpgradeReply
	return s.Call(ctx, "m1", store.CmdUpgrade, store.UpgradeRequest{Release: release, Attempt: attempt, HealthBound: store.Duration(2 * time.Second)}, &rep)
}

func script(body string) io.Reader { return strings.NewReader("#!/bin/sh\n" + body + "\n") }

// Every refused upgrade says why and leaves the machine as it was: no
// trial begun, the current link untouched, the agent serving.
func TestUpgradeRefusals(t *testing.T) {
	runningVersion(t, "1.5.0")
	srv := storetest.Start(t)
	releases := upgrade.ForData(t.TempDir())
	gwReleases := upgrade.Dir(filepath.Join(t.TempDir(), "gw"))
	gwPidfile := filepath.Join(t.TempDir(), "gw.pid")
	startAgentAlone(t, srv, t.TempDir(), func(c *Config) {
		c.Releases, c.Self = releases, "/usr/bin/control"
		c.GatewayReleases, c.GatewayPidfile = gwReleases, gwPidfile
	})
	s := srv.Store
	ctx := context.Background()
	push := func(v string, bins map[string]io.Reader) {
		t.Helper()
		if err := s.PushRelease(ctx, &store.ReleaseRecord{Release: v, Arch: version.Arch()}, bins); err != nil {
			t.Fatal(err)
		}
	}
	// 1.7.0's control says it is another release; 1.8.0 carries a
	// gateway that does not come up.
	push("1.7.0", map[string]io.Reader{"control": script(`echo "control 1.9.9 (linux/amd64, go)"`)})
	push("1.8.0", map[string]io.Reader{"control": script(`echo "control 1.8.0 (linux/amd64, go)"`), "caddy": script("exit 1")})
	// The "gateway": a process that answers SIGHUP with a failed swap,
	// running a binary named as the gateway's is (the agent signals no
	// other).
	trapped := gwPidfile + ".trapped"
	// A shell cannot trap a signal ignored when it started, and a child
	// inherits an ignored signal: run under nohup (as CI may be), the
	// stand-in never heard the SIGHUP and the swap was "not reported".
	// While this process handles SIGHUP itself, its children start with
	// the default, which the shell's trap replaces.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(hup) })
	gw := exec.Command(binaryNamed(t, "/bin/sh", "caddy"), "-c", `trap 'echo "failed new: the new gateway exited before it served" > `+gwPidfile+`.swap' HUP; touch `+trapped+`; while :; do sleep 0.1; done`)
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Process.Kill(); _ = gw.Wait() })
	if err := os.WriteFile(gwPidfile, []byte(strconv.Itoa(gw.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 5*time.Second, "the stand-in gateway trapping SIGHUP", func() bool {
		_, err := os.Stat(trapped)
		return err == nil
	})

	for _, tc := range []struct {
		name, release string
		attempt       int
		code, says    string
	}{
		{"not a version", "latest", 10, store.CodeInvalid, "MAJOR.MINOR.PATCH"},
		{"a downgrade", "1.4.0", 11, store.CodeConflict, "--allow-downgrade"},
		{"never pushed", "1.6.0", 12, store.CodeNotFound, "no release 1.6.0"},
		{"an older attempt", "1.6.0", 5, store.CodeStale, "older than attempt 12"},
		{"a binary that says another version", "1.7.0", 13, store.CodeInvalid, `reports "control 1.9.9`},
		{"a gateway that does not serve", "1.8.0", 14, store.CodeUpgradeFailed, "did not serve (the old one still does)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := upgradeCall(t, s, tc.release, tc.attempt)
			se := store.AsError(err)
			if se == nil || se.Code != tc.code || !strings.Contains(se.Message, tc.says) {
				t.Fatalf("got %v, want %s saying %q", err, tc.code, tc.says)
			}
			if tr, err := releases.Load(); err != nil || tr != nil {
				t.Fatalf("a trial was begun: %+v %v", tr, err)
			}
			if cur, _ := releases.Current(); cur != "" {
				t.Fatalf("current names %s", cur)
			}
			if cur, _ := gwReleases.Current(); cur != "" {
				t.Fatalf("the gateway's link was left on %s", cur)
			}
		})
	}
	if err := s.Call(ctx, "m1", store.CmdCapacity, nil, nil); err != nil {
		t.Fatalf("the agent stopped answering after the refusals: %v", err)
	}
}

// An agent run with no release dir (the one `control server --agent`
// runs) refuses an upgrade, saying so.
func TestUpgradeWithoutAReleaseDir(t *testing.T) {
	runningVersion(t, "1.5.0")
	srv := storetest.Start(t)
	startAgentAlone(t, srv, t.TempDir())
	if err := upgradeCall(t, srv.Store, "1.8.0", 1); !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "no release dir") {
		t.Fatalf("no release dir: %v", err)
	}
}

// An outcome that came after the latest look but before the bound is the
// outcome, not a timeout: the bound is looked at last. (A gateway's swap
// report written then was reported as "did not report its swap".)
func TestPollUntilLooksAtTheBound(t *testing.T) {
	start := time.Now()
	err := pollUntil(context.Background(), pollEvery*3/2, func() (bool, error) {
		return time.Since(start) > pollEvery*5/4, nil
	})
	if err != nil {
		t.Fatalf("an outcome there before the bound: %v", err)
	}
	if err := pollUntil(context.Background(), pollEvery/2, func() (bool, error) { return false, nil }); err != errPollTimeout {
		t.Fatalf("no outcome: %v, want the timeout", err)
	}
}

func TestReadPidfile(t *testing.T) {
	dir := t.TempDir()
	if pid, err := readPidfile(filepath.Join(dir, "none")); pid != 0 || err != nil {
		t.Fatalf("missing pidfile: %d %v", pid, err)
	}
	for _, bad := range []string{"", "abc", "1", "-4"} {
		p := filepath.Join(dir, "bad")
		if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readPidfile(p); !store.HasCode(err, store.CodeInvalid) {
			t.Errorf("pidfile %q: %v, want invalid", bad, err)
		}
	}
}
