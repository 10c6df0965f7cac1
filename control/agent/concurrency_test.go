package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Requests that read an instance (inventory, capacity, readiness, drain,
// logs, metrics) arrive while the agent heals it after crashes and
// restarts it on command: under the race detector (make test runs this
// package with -race) every read of an instance's record and run must be
// ordered with the healer's writes.
func TestRequestsDuringHealingAndRestarts(t *testing.T) {
	srv := storetest.Start(t)
	f := startAgent(t, srv, t.TempDir())
	commitOne(t, srv.Store, "web-0-a")
	rec := startReady(t, srv.Store, "web-0-a", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var wg sync.WaitGroup
	ask := func(command string, req any) {
		defer wg.Done()
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_ = srv.Store.Call(cctx, "m1", command, req, nil)
			ccancel()
		}
	}
	wg.Add(5)
	go ask(store.CmdInventory, nil)
	go ask(store.CmdCapacity, nil)
	go ask(store.CmdReadiness, store.ReadinessRequest{InstanceID: rec.ID, Namespace: "shop", Timeout: store.Duration(100 * time.Millisecond)})
	go ask(store.CmdLogs, store.LogsRequest{InstanceID: rec.ID, Namespace: "shop", Offset: -1})
	go ask(store.CmdDrainInstance, store.InstanceRequest{InstanceID: rec.ID, Namespace: "shop"})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			collect(f.agent)
		}
	}()

	// Two crashes healed by the agent, then a restart on command.
	for i := range 2 {
		pid := record(t, srv.Store, rec).PID
		if err := killPID(pid); err != nil {
			t.Fatal(err)
		}
		storetest.Eventually(t, 10*time.Second, "the instance to be restarted", func() bool {
			r := record(t, srv.Store, rec)
			return r.Restarts == i+1 && r.PID != pid && r.State != store.InstanceBackoff
		})
	}
	var rep store.LeasedReply
	err := srv.Store.Call(context.Background(), "m1", store.CmdRestart, store.LeasedCommand{InstanceID: rec.ID, Namespace: "shop", Service: "web",
		Attempt: 1, Grace: store.Duration(time.Second)}, &rep)
	cancel()
	wg.Wait()
	if err != nil || !rep.Done {
		t.Fatalf("restart on command: %+v %v", rep, err)
	}
}

// collect scrapes the agent's metrics once.
func collect(a *Agent) {
	ch := make(chan prometheus.Metric, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range ch {
		}
	}()
	a.Collector().Collect(ch)
	close(ch)
	<-done
}
