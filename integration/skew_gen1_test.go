package integration

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

// gen1Release is the newest release whose readers read instance records
// only (schema generation 1): 3292e29, the last commit before instance
// observations (7fdb3aa). The previous release already reads observations,
// so the skew tests against it cannot see what issue 39 fears of a reader
// of generation 1.
const gen1Release = "v0.37.0"

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
