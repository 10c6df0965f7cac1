package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// storedState is the state instance rec's record holds in the store, as a
// reader of generation 1 reads it (the record alone).
func storedState(t *testing.T, s *store.Store, rec store.InstanceRecord) store.InstanceState {
	t.Helper()
	got, _, err := s.GetInstance(context.Background(), rec.Key())
	if err != nil {
		t.Fatal(err)
	}
	return got.State
}

// Until the floor says every reader reads observations, an instance's
// ready and draining also go into its record, where a reader of
// generation 1 reads them; once the floor is raised, the agent sees it
// within a beat and writes observations only.
func TestInstanceStatesReachOldReadersUntilTheFloorRises(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	f := startAgentAlone(t, srv, t.TempDir(), func(c *Config) { c.BeatInterval = 100 * time.Millisecond })
	serveRepublish(t, srv)
	a := startReady(t, srv.Store, "web-0-a", nil)
	if got := storedState(t, srv.Store, a); got != store.InstanceReady {
		t.Fatalf("no floor: the record says %s, want ready (a reader of instance records alone must see it)", got)
	}
	if err := srv.Store.Call(ctx, "m1", store.CmdDrainInstance, store.InstanceRequest{InstanceID: a.ID, Namespace: "shop"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := storedState(t, srv.Store, a); got != store.InstanceDraining {
		t.Fatalf("no floor: after the drain the record says %s, want draining", got)
	}

	if _, err := srv.Store.RaiseFloor(ctx, store.GenerationObserved, "test"); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 5*time.Second, "agent to see the floor", f.agent.readersObserve)
	b := startReady(t, srv.Store, "web-0-b", nil)
	if got := storedState(t, srv.Store, b); got != store.InstanceStarting {
		t.Errorf("floor at %d: the record says %s, want the start's %s (observations only)", store.GenerationObserved, got, store.InstanceStarting)
	}
	if got := record(t, srv.Store, b); got.State != store.InstanceReady {
		t.Errorf("floor at %d: read as %s, want ready", store.GenerationObserved, got.State)
	}
}

// An agent of a generation below the store's floor refuses to run, naming
// the release the store needs.
func TestAgentRefusesAStoreAboveItsGeneration(t *testing.T) {
	srv := storetest.Start(t)
	storetest.FutureFloor(t, srv.Store, 99, "9.0.0")
	cfg := Config{Store: srv.Connect(t), Machine: store.MachineRecord{ID: "m1", Address: "127.0.0.1", State: store.MachineActive},
		DataDir: t.TempDir(), Driver: &runtime.Process{}}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = a.Run(ctx)
	if !store.HasCode(err, store.CodeTooOld) || !strings.Contains(err.Error(), "9.0.0") {
		t.Fatalf("Run on a floor of generation 99: %v, want too_old naming 9.0.0", err)
	}
}
