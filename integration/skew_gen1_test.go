package integration

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// gen1Release is the newest release whose readers read instance records
// only (schema generation 1): 3292e29, the last commit before instance
// observations (7fdb3aa). The previous release already reads observations,
// so the skew tests against it cannot see what issue 39 fears of a reader
// of generation 1.
const gen1Release = "v0.37.0"

// floorlessRelease is the one release that reads instance observations
// (generation 2) but has no floor: its control server leaves the floor
// unset whatever runs, so agents of this tree beside it keep writing for
// readers of generation 1. Named, not the previous release: from v0.39.0
// on, a control server raises the floor once nothing older is heard from.
const floorlessRelease = "v0.38.0"

// A fleet on v0.37.0 whose agent box is upgraded to this tree out of order
// (its package, say), ahead of the control plane: outside the skew policy
// (agents never ahead of the control plane, one minor release at a time).
// Unlike the previous release's control plane, this one cannot work with
// the agent at all; the test holds the policy's answer for such a pair: no
// silent outage, but refusals the operator reads, with the previous
// revision still served. Two changes since
// v0.37.0 make the refusals:
//
//   - agents act only on signed orders (a2e0d3f, 05e8d1a, v0.38.0): the
//     v0.37.0 CLI's deploy is refused, order_refused (unsigned);
//   - instances' states are recorded in cp_observed_<auth> (7fdb3aa), a
//     bucket only a control server of v0.38.0 or later provisions: even the
//     CLI of this tree, which signs its orders, cannot deploy (it reads
//     the observations first; were it to get further, the agent could not
//     record its candidates), and says which bucket is missing.
//
// The instances the agent adopted keep being served and are listed ready by
// the v0.37.0 CLI: 0 failed requests throughout.
func TestSkewGeneration1ControlPlaneRefusesANewAgent(t *testing.T) {
	old := buildRelease(t, gen1Release)
	c := newClusterOn(t, old.control)
	c.agentBin = old.control
	c.join("m1")
	gw := c.startGatewayBin(old.caddy, "gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	ids := allRouted(t, c, 2, gw)

	load := startSkewLoad(gw)
	c.agents["m1"].stop(syscall.SIGTERM)
	agent := c.restartAgent("m1") // this tree's: it adopts the instances
	agent.waitOutput(t, `adopted instance.*`+ids[1], 10*time.Second)
	if again := allRouted(t, c, 2, gw); !slices.Equal(again, ids) {
		t.Fatalf("after the agent's upgrade the live commit routes %v, want %v", again, ids)
	}

	out, errOut, code := c.control(applyArgs(c.manifest("v2.yaml", gwV2))...)
	if code == 0 || !strings.Contains(errOut, "order_refused") || !strings.Contains(errOut, "not a signed order") ||
		!strings.Contains(out, "nothing was routed, the previous revision keeps serving") {
		t.Fatalf("the %s CLI's deploy to an agent of this tree: exit %d, want order_refused (unsigned)\n%s\n%s", gen1Release, code, out, errOut)
	}
	out, errOut, code = runControlBin(t, bins.control, c.natsEnv(storagenode.RoleControl, ""), applyArgs(c.manifest("v2.yaml", gwV2))...)
	if code == 0 || !strings.Contains(errOut, "bucket cp_observed_default (has `control server` provisioned this authority?)") {
		t.Fatalf("this tree's CLI's deploy on a store of %s: exit %d, want a refusal naming the observation bucket\n%s\n%s", gen1Release, code, out, errOut)
	}
	if again := allRouted(t, c, 2, gw); !slices.Equal(again, ids) {
		t.Fatalf("after the refused deploys the live commit routes %v, want %v", again, ids)
	}
	servedVersion(t, gw, "1")
	report := load.end(t)

	if out := c.mustControl("version"); !strings.Contains(out, " "+old.version()+" ") {
		t.Fatalf("the CLI is not %s: %s", gen1Release, out)
	}
	t.Logf("control server, CLI and gateway of %s, agent of this tree: two deploys refused under load: %s", gen1Release, report)
}

// Readers of generation 1 beside an agent of this tree on a store that has
// the observation record: the control server and CLI of v0.38.0 (which
// provision and read observations but raise no floor, so the floor stays
// unset), an agent of v0.38.0 (m2), an agent of this tree (m1), and an operator still on a v0.37.0 CLI, which lists
// instance records and publishes routing from them (machine rm). With the
// floor below generation 2 the agent of this tree writes ready into the
// instance records as well as into its observations
// (control/agent/readers.go): the v0.37.0 CLI lists m1's instance ready
// and, removing m2, publishes shop's routing with it, under load without a
// failed request. Without those writes it lists it starting and its
// republish leaves it out: shop goes dark.
func TestSkewGeneration1ReadersSeeANewAgentsInstances(t *testing.T) {
	gen1 := buildRelease(t, gen1Release)
	prev := buildRelease(t, floorlessRelease)
	c := newClusterOn(t, prev.control)
	c.agentBin = prev.control
	c.join("m2")
	c.agentBin = ""
	agent := c.join("m1")
	gw := c.startGateway("gw1")
	gen1CLI := func(args ...string) string {
		t.Helper()
		out, errOut, code := runControlBin(t, gen1.control, c.natsEnv(storagenode.RoleControl, ""), args...)
		if code != 0 {
			t.Fatalf("control %s (%s): exit %d\n%s\n%s", strings.Join(args, " "), gen1Release, code, out, errOut)
		}
		return out
	}
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	ids := allRouted(t, c, 2, gw)
	var onM1 []string
	for _, in := range c.instances("shop") {
		if in.Machine == "m1" && slices.Contains(ids, in.ID) {
			onM1 = append(onM1, in.ID)
		}
	}
	if len(onM1) != 1 {
		t.Fatalf("want one live instance on each machine: m1 runs %v of %v", onM1, ids)
	}

	var listed []store.InstanceRecord
	if err := json.Unmarshal([]byte(gen1CLI("instances", "--namespace", "shop", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	// m2's agent, of the previous release, writes ready in its
	// observations alone: to this reader its instance stays starting (the
	// outage issue 39 names, and proof that the reader reads records
	// only). m1's agent writes it for such readers too.
	for _, in := range listed {
		want := store.InstanceReady
		if in.Machine == "m2" {
			want = store.InstanceStarting
		}
		if slices.Contains(ids, in.ID) && in.State != want {
			t.Errorf("the %s CLI lists live instance %s on %s as %s, want %s", gen1Release, in.ID, in.Machine, in.State, want)
		}
	}

	load := startSkewLoad(gw)
	if out := gen1CLI("machine", "rm", "m2", "--force"); !strings.Contains(out, "shop/web") {
		t.Fatalf("machine rm m2 (%s) republished nothing:\n%s", gen1Release, out)
	}
	eventually(t, 15*time.Second, "the gateway to route m1's instance alone", func() bool {
		st, err := gw.projection()
		return err == nil && st.Routable == 1 && servesOnly(gw, "shop.example.com", onM1, 10)
	})
	time.Sleep(time.Second) // load on the routing the old CLI published
	report := load.end(t)

	if strings.Contains(agent.output(), "every reader reads instance observations") {
		t.Fatalf("the agent stopped writing for readers of generation 1:\n%s", agent.output())
	}
	t.Logf("control plane and m2 of %s, m1 of this tree, an operator's %s CLI listing and republishing: %s", prev.tag, gen1Release, report)
}
