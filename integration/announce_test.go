package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Every process says what it is, and a process too old for the store is
// refused. A control server announces its release and schema generation
// and, with nothing older heard from, raises the store's floor to
// generation 2; `control status` and `control fleet versions` show them.
// Then a floor of generation 99 is written, as a future release would:
// the CLI, an agent (with its own agent credentials) and the control
// server itself, each started again, refuse, naming the release the store
// needs (9.0.0). Gateways and meshd are refused the same way in their
// packages' tests (caddymodule, meshd/node).
func TestTooOldProcessesAreRefused(t *testing.T) {
	c := newAuthCluster(t)
	agent := c.join("a1")
	eventually(t, 20*time.Second, "the server's announcement, the agent's and the floor raised", func() bool {
		out := c.mustControl("status")
		return strings.Contains(out, fmt.Sprintf("control server: 1 on dev gen %d", store.SchemaGeneration)) && strings.Contains(out, fmt.Sprintf("agent: 1 on dev gen %d", store.SchemaGeneration)) &&
			strings.Contains(out, "store floor: schema generation 2 (edgeplane >= 0.38.0), raised by control server")
	})
	vs := c.mustControl("fleet", "versions")
	for _, want := range []string{"PROCESS", "control server  dev", fmt.Sprintf("agent           dev      %d           1: a1", store.SchemaGeneration), "store floor: schema generation 2"} {
		if !strings.Contains(vs, want) {
			t.Fatalf("fleet versions lacks %q:\n%s", want, vs)
		}
	}
	if !strings.Contains(agent.output(), "every reader reads instance observations") {
		t.Errorf("the agent did not learn the floor:\n%s", agent.output())
	}

	storetest.FutureFloor(t, c.store, 99, "9.0.0")
	const refusal = "too_old: this store needs edgeplane >= 9.0.0 (schema generation 99)"
	if _, errOut, code := c.control("status"); code == 0 || !strings.Contains(errOut, refusal+"; this is control cli") {
		t.Fatalf("control status on floor 99: exit %d\n%s", code, errOut)
	}
	agent.stop(syscall.SIGTERM)
	again := start(t, "agent a1 (floor 99)", c.natsEnv(storagenode.RoleAgent, "a1"), bins.control, "agent", "--data", c.agentDir("a1"), "--stop-grace", "2s")
	waitExit(t, again, 20*time.Second)
	if !strings.Contains(again.output(), refusal+"; this is agent") {
		t.Fatalf("agent on floor 99:\n%s", again.output())
	}
	c.server.stop(syscall.SIGTERM)
	server := start(t, "control server (floor 99)", nil, bins.control,
		append([]string{"server", "--data", c.serverDir(), "--listen", "127.0.0.1:0"}, c.serverArgs...)...)
	waitExit(t, server, 30*time.Second)
	if !strings.Contains(server.output(), refusal+"; this is control") {
		t.Fatalf("control server on floor 99:\n%s", server.output())
	}
}

// waitExit waits for p to end by itself.
func waitExit(t *testing.T, p *proc, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still runs after %s:\n%s", p.name, timeout, p.output())
	}
}
