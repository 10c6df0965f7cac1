package integration

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// machineList is `control machine ls -o json`.
func machineList(t *testing.T, c *cluster, args ...string) map[string]machines.Listed {
	t.Helper()
	out := c.mustControl(append([]string{"machine", "ls", "-o", "json"}, args...)...)
	var list []machines.Listed
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("machine ls: %v\n%s", err, out)
	}
	m := map[string]machines.Listed{}
	for _, l := range list {
		m[l.ID] = l
	}
	return m
}

// machine ls reads the heartbeats and states agents write, asking no
// machine: liveness follows the beats (fresh, stale after three missed,
// offline after ten), instance counts follow what the agents run.
func TestMachineLivenessFromHeartbeats(t *testing.T) {
	c := newCluster(t)
	c.agentArgs = []string{"--heartbeat", "200ms"}
	c.join("m1")
	m2 := c.join("m2")
	ls := machineList(t, c)
	for _, id := range []string{"m1", "m2"} {
		if l := ls[id]; l.Liveness != store.MachineFresh || l.Free != 256 || len(l.Drivers) == 0 || l.Probed {
			t.Fatalf("%s: %+v", id, l)
		}
	}
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	eventually(t, 5*time.Second, "the agents' states to count 3 instances", func() bool {
		ls := machineList(t, c)
		return ls["m1"].Instances+ls["m2"].Instances == 3 && ls["m1"].Free+ls["m2"].Free == 512-3
	})
	m2.stop(syscall.SIGKILL)
	eventually(t, 5*time.Second, "m2 to go stale, then offline", func() bool {
		return machineList(t, c)["m2"].Liveness == store.MachineStale
	})
	eventually(t, 5*time.Second, "m2 to go offline", func() bool {
		return machineList(t, c)["m2"].Liveness == store.MachineOffline
	})
	if l := machineList(t, c)["m1"]; l.Liveness != store.MachineFresh {
		t.Fatalf("m1 while m2 is down: %+v", l)
	}
	probed := machineList(t, c, "--probe", "--probe-timeout", "300ms")
	if !probed["m1"].Reachable || probed["m2"].Reachable || !probed["m2"].Probed {
		t.Fatalf("probed: %+v", probed)
	}
	c.restartAgent("m2")
	eventually(t, 5*time.Second, "m2 to be fresh again", func() bool {
		return machineList(t, c)["m2"].Liveness == store.MachineFresh
	})
}
