package agent

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The store goes back in time under a running agent: its storage node is
// restarted from a copy taken before an instance started. The agent keeps
// the instance running and reports it in its machine state as one the
// store has no record of; once the instance is stopped, the report is
// empty again.
func TestAgentReportsInstancesTheRewoundStoreForgot(t *testing.T) {
	defer func(g time.Duration) { recordGrace = g }(recordGrace)
	recordGrace = 0
	dir, old, addr := t.TempDir(), filepath.Join(t.TempDir(), "old"), storetest.FreeAddr(t)
	srv := storetest.StartIn(t, dir, addr)
	startAgentAlone(t, srv, t.TempDir(), func(c *Config) { c.BeatInterval = 100 * time.Millisecond })
	known := startReady(t, srv.Store, "w1", nil)

	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	if out, err := exec.Command("cp", "-a", dir, old).CombinedOutput(); err != nil {
		t.Fatalf("copying the store: %v: %s", err, out)
	}
	srv = storetest.StartIn(t, dir, addr)
	waitReachable(t, srv.Store)
	forgotten := startReady(t, srv.Store, "w2", nil)
	unrecorded := func(s *store.Store) []string {
		st, err := s.MachineStateOf(context.Background(), "m1")
		if err != nil {
			return []string{"unreadable: " + err.Error()}
		}
		return st.Unrecorded
	}
	time.Sleep(300 * time.Millisecond) // some checks, after the restart
	if got := unrecorded(srv.Store); len(got) != 0 {
		t.Fatalf("before the rewind the agent reports %v unrecorded", got)
	}

	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	srv = storetest.StartIn(t, old, addr)
	storetest.Eventually(t, 10*time.Second, "the agent to report w2", func() bool {
		return slices.Equal(unrecorded(srv.Store), []string{forgotten.ID})
	})
	if !answers(forgotten) || !answers(known) {
		t.Fatal("an instance stopped running after the rewind")
	}

	// Stopped (the operator's call), it is no longer reported.
	if err := srv.Store.Call(context.Background(), "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: forgotten.ID, Namespace: "shop"}, nil); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 10*time.Second, "the report to clear", func() bool { return len(unrecorded(srv.Store)) == 0 })
}

// waitReachable waits until m1's agent answers through s.
func waitReachable(t *testing.T, s *store.Store) {
	t.Helper()
	storetest.Eventually(t, 10*time.Second, "agent to answer", func() bool {
		return s.Call(context.Background(), "m1", store.CmdCapacity, nil, nil) == nil
	})
}
