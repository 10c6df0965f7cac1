package integration

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

// control logs reads instances' output from their machines: a bounded
// tail, one instance, since a moment, and -f showing a new line within a
// second.
func TestLogsFromTheMachines(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	c.join("m2")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", gwV1), "--drain-grace", "100ms")
	insts := c.instances("shop")
	if len(insts) != 2 {
		t.Fatalf("want 2 instances, got %d", len(insts))
	}
	say := func(addr, line string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/log?line=" + url.QueryEscape(line))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	out := c.mustControl("logs", "shop/web")
	for _, in := range insts {
		if !regexp.MustCompile(`(?m)^\[` + in.ID + `\] .*hello listening on `).MatchString(out) {
			t.Fatalf("logs lack %s's start line:\n%s", in.ID, out)
		}
	}
	one := c.mustControl("logs", "shop/web", "--instance", insts[0].ID)
	if strings.Contains(one, insts[1].ID) || !strings.Contains(one, "hello listening on") || strings.HasPrefix(one, "[") {
		t.Fatalf("logs of one instance:\n%s", one)
	}
	// Once the start lines are older than 2 s (and the agents sampled the
	// sizes), --since 2s leaves them out and shows a line said now.
	eventually(t, 10*time.Second, "--since 2s to be empty", func() bool {
		return strings.TrimSpace(c.mustControl("logs", "shop/web", "--since", "2s")) == ""
	})
	say(addrOf(insts[1]), "recent line")
	s := c.mustControl("logs", "shop/web", "--since", "2s")
	if !strings.Contains(s, "recent line") || strings.Contains(s, "hello listening on") {
		t.Fatalf("--since 2s right after a line:\n%s", s)
	}

	f := start(t, "control logs -f", c.natsEnv(storagenode.RoleControl, ""), bins.control, "logs", "shop/web", "-f")
	f.waitOutput(t, "hello listening on", 10*time.Second)
	var worst time.Duration
	for i := range 5 {
		line := "followed line " + string(rune('a'+i))
		said := time.Now()
		say(addrOf(insts[i%2]), line)
		f.waitOutput(t, regexp.QuoteMeta(line), 5*time.Second)
		worst = max(worst, time.Since(said))
	}
	if worst > time.Second {
		t.Fatalf("control logs -f showed a line %s after it was printed; want within 1s", worst)
	}
	f.stop(syscall.SIGINT)
	if code := f.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("logs -f ended with %d after Ctrl-C:\n%s", code, f.output())
	}
	if _, errOut, code := c.control("logs", "shop/nosuch"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("logs of an unknown service: %d\n%s", code, errOut)
	}
	if _, _, code := c.control("logs", "shop"); code != 2 {
		t.Fatalf("logs without a service: exit %d", code)
	}
	t.Logf("control logs -f: a printed line shown within %s (worst of 5)", worst.Round(time.Millisecond))
}
