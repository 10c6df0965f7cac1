package integration

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
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

// An apply asks only the machines it places on (chosen from what agents
// last wrote), not every machine; one that does not answer although its
// heartbeat is fresh is set aside and the slot placed again.
func TestPlacementAsksOnlyTheMachinesItUses(t *testing.T) {
	c := newCluster(t)
	c.agentArgs = []string{"--heartbeat", "30s"} // beats stay fresh after an agent dies
	c.join("m1")
	m2 := c.join("m2")
	c.join("m3")
	v := func(n string) string { return writeManifest(t, c.dir, n) } // one replica of web
	out := c.mustControl("deploy", "apply", "-f", v("1"), "--drain-grace", "100ms")
	if !strings.Contains(out, "[3/9] probe: 1 machines asked, 1 answered") {
		t.Fatalf("the first apply asked more than the machine it uses:\n%s", out)
	}
	// Placement prefers the least loaded machine, by ID on a tie: the
	// instance went to m1, the next candidate goes to m2, whose agent now
	// dies with its heartbeat still fresh.
	if first := c.instances("shop")[0].Machine; first != "m1" {
		t.Fatalf("the first instance went to %s", first)
	}
	m2.stop(syscall.SIGKILL)
	out = c.mustControl("deploy", "apply", "-f", v("2"), "--drain-grace", "100ms", "--probe-timeout", "500ms")
	if !regexp.MustCompile(`\[3/9\] probe: 2 machines asked, 1 answered; not used: m2 \(`).MatchString(out) {
		t.Fatalf("the apply did not set the dead m2 aside:\n%s", out)
	}
	if in := c.instances("shop"); len(in) != 1 || in[0].Machine == "m2" {
		t.Fatalf("after the apply: %+v", in)
	}
}

// control status: the namespace's counts follow its instances within about
// the flush interval, instances on a machine whose heartbeat went stale
// count as stale, and the server's metrics say the same.
func TestFleetStatus(t *testing.T) {
	metrics := freeAddr(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--metrics-listen", metrics}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	c.agentArgs = []string{"--heartbeat", "200ms"}
	c.join("m1")
	m2 := c.join("m2")
	c.startGateway("gw1") // reports its routing sequence: the gateways' lag
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	status := func() *fleetView {
		t.Helper()
		var v fleetView
		if err := json.Unmarshal([]byte(c.mustControl("status", "-o", "json")), &v); err != nil {
			t.Fatal(err)
		}
		return &v
	}
	shop := func(v *fleetView) store.Counts {
		for _, n := range v.Namespaces {
			if n.Namespace == "shop" {
				return n.Counts
			}
		}
		return store.Counts{}
	}
	eventually(t, 5*time.Second, "3 ready instances of shop", func() bool {
		v := status()
		return shop(v).Ready == 3 && v.Machines.Liveness[store.MachineFresh] == 2 && len(v.Gateways) == 1 && v.Gateways[0].Lag == 0
	})
	if ds := c.mustControl("deploy", "status", "shop"); !strings.Contains(ds, "instances: 3 ready, 0 starting") || !strings.Contains(ds, "machines:  2, 2 with all instances ready") {
		t.Fatalf("deploy status without per-machine progress:\n%s", ds)
	}
	var onM2 []store.InstanceRecord
	for _, in := range c.instances("shop") {
		if in.Machine == "m2" {
			onM2 = append(onM2, in)
		}
	}
	if err := syscall.Kill(onM2[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 5*time.Second, "the killed instance out of the ready count", func() bool { return shop(status()).Ready == 2 })
	lag := time.Since(killed)
	eventually(t, 10*time.Second, "the instance back", func() bool { return shop(status()).Ready == 3 })
	m2.stop(syscall.SIGKILL)
	eventually(t, 10*time.Second, "m2's instances to count as stale", func() bool {
		v := status()
		return shop(v).Stale == len(onM2) && shop(v).Ready == 3-len(onM2) && v.Machines.Liveness[store.MachineFresh] == 1
	})
	if text := c.mustControl("status"); !strings.Contains(text, "m2 (stale") && !strings.Contains(text, "m2 (offline") {
		t.Fatalf("control status does not name m2:\n%s", text)
	}
	if ds := c.mustControl("deploy", "status", "shop"); !regexp.MustCompile(`m2 \(0 of \d ready\)`).MatchString(ds) {
		t.Fatalf("deploy status does not name m2:\n%s", ds)
	}
	if m := scrape(t, metrics); !strings.Contains(m, fmt.Sprintf(`edgeplane_fleet_instances{namespace="shop",state="stale"} %d`, len(onM2))) {
		t.Fatalf("server metrics:\n%s", m)
	}
	t.Logf("a killed instance left the ready count of control status %s later (flush every 1 s)", lag.Round(10*time.Millisecond))
}

// fleetView is `control status -o json`.
type fleetView struct {
	Namespaces []struct {
		Namespace string       `json:"namespace"`
		Counts    store.Counts `json:"counts"`
	} `json:"namespaces"`
	Machines struct {
		Liveness map[string]int `json:"liveness"`
	} `json:"machines"`
	Gateways []struct {
		Gateway string `json:"gateway"`
		Lag     uint64 `json:"lag"`
	} `json:"gateways"`
}
