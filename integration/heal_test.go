package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// flaky is hello that exits with status 3 at start while $DIR/crash exists.
const flaky = `
namespace: shop
services:
  web:
    command: ["/bin/sh", "-c", "if [ -e @DIR@/crash ]; then echo crashing; exit 3; fi; exec @HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`

// A process killed with kill -9 is restarted by its agent and back in the
// routing within the backoff and its readiness; one that keeps crashing
// is backed off and shown as such, in control instances and the agent's
// metrics.
func TestProcessInstancesHeal(t *testing.T) {
	c := newCluster(t)
	metrics := freeAddr(t)
	c.agentArgs = []string{"--restart-backoff", "500ms", "--restart-backoff-max", "4s", "--metrics-listen", metrics}
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl("deploy", "apply", "-f", c.manifest("flaky.yaml", strings.ReplaceAll(flaky, "@DIR@", c.dir)), "--drain-grace", "100ms")
	in := c.instances("shop")[0]
	eventually(t, 5*time.Second, "the gateway to serve", func() bool { return servesOnly(gw, "shop.example.com", []string{in.ID}, 2) })

	if err := syscall.Kill(in.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 10*time.Second, "the killed instance to be served again", func() bool {
		return servesOnly(gw, "shop.example.com", []string{in.ID}, 2)
	})
	back := time.Since(killed)
	after := c.instances("shop")[0]
	if after.ID != in.ID || after.Restarts != 1 || after.PID == in.PID || after.Port != in.Port || after.LastExit != "killed by signal killed" {
		t.Fatalf("after the restart: %+v", after)
	}
	if ls := c.mustControl("instances"); !strings.Contains(ls, "killed by signal killed") {
		t.Fatalf("control instances does not show the last exit:\n%s", ls)
	}
	if m := scrape(t, metrics); !strings.Contains(m, fmt.Sprintf(`edgeplane_agent_instance_restarts{instance=%q,namespace="shop",service="web"} 1`, in.ID)) ||
		!strings.Contains(m, "edgeplane_agent_restarts_total 1") {
		t.Fatalf("agent metrics:\n%s", m)
	}

	// Now it crashes at every start.
	if err := os.WriteFile(filepath.Join(c.dir, "crash"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(after.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var looping store.InstanceRecord
	eventually(t, 20*time.Second, "the crash loop to back off", func() bool {
		looping = c.instances("shop")[0]
		return looping.State == store.InstanceBackoff && looping.Restarts >= 4 && looping.LastExit == "exited with status 3"
	})
	if wait := looping.NextRestart.Sub(looping.LastExitAt); wait < 2*time.Second {
		t.Fatalf("after %d restarts the backoff is %s", looping.Restarts, wait)
	}
	if ls := c.mustControl("instances"); !strings.Contains(ls, "backoff") || !strings.Contains(ls, "exited with status 3; restart") {
		t.Fatalf("control instances does not show the crash loop:\n%s", ls)
	}
	if code, _, err := gw.request("shop.example.com", "/"); err != nil || code == 200 {
		t.Fatalf("a crash-looping service answered %d %v", code, err)
	}
	if m := scrape(t, metrics); !strings.Contains(m, `edgeplane_agent_instances{state="backoff"} 1`) {
		t.Fatalf("agent metrics during the crash loop:\n%s", m)
	}
	// Fixed: the next restart brings it back.
	if err := os.Remove(filepath.Join(c.dir, "crash")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the fixed instance to be served", func() bool {
		return servesOnly(gw, "shop.example.com", []string{in.ID}, 2)
	})
	// An operator's restart and stop.
	out := c.mustControl("instance", "restart", in.ID)
	if !strings.Contains(out, "restarted") || !servesOnly(gw, "shop.example.com", []string{in.ID}, 2) {
		t.Fatalf("instance restart:\n%s", out)
	}
	out = c.mustControl("instance", "stop", in.ID)
	if !strings.Contains(out, "stopped") {
		t.Fatalf("instance stop:\n%s", out)
	}
	eventually(t, 5*time.Second, "a stopped instance to leave the routing", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code != 200
	})
	if st := c.instances("shop")[0]; st.State != store.InstanceStopped {
		t.Fatalf("after instance stop: %+v", st)
	}
	if _, errOut, code := c.control("instance", "restart", "nosuch"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("restart of an unknown instance: %d\n%s", code, errOut)
	}
	t.Logf("killed instance served again %s after kill -9 (backoff 500ms ±20%% + readiness); crash loop at restart %d waits %s",
		back.Round(10*time.Millisecond), looping.Restarts, looping.NextRestart.Sub(looping.LastExitAt).Round(10*time.Millisecond))
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
