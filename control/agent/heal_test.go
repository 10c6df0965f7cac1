package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func record(t *testing.T, s *store.Store, rec store.InstanceRecord) store.InstanceRecord {
	t.Helper()
	got, err := s.CurrentInstance(context.Background(), rec.Key())
	if err != nil {
		t.Fatal(err)
	}
	return *got
}

// A crashed instance leaves the routing at once and comes back, same
// identity and port, once restarted and ready again.
func TestCrashedInstanceIsRestartedAndRejoinsTheRouting(t *testing.T) {
	srv := storetest.Start(t)
	f := startAgent(t, srv, t.TempDir())
	commitOne(t, srv.Store, "web-0-a")
	rec := startReady(t, srv.Store, "web-0-a", nil)
	if _, err := routing.RepublishService(context.Background(), srv.Store, "shop", "web"); err != nil {
		t.Fatal(err)
	}
	if err := killPID(rec.PID); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 5*time.Second, "the crash to take it out of the routing", func() bool {
		return record(t, srv.Store, rec).State == store.InstanceBackoff && len(lastWebEvent(t, srv.Store).Endpoints) == 0
	})
	down := record(t, srv.Store, rec)
	if down.LastExit != "killed by signal killed" || down.NextRestart.IsZero() || !strings.Contains(down.Error, "restart 1 in") {
		t.Fatalf("record in backoff: %+v", down)
	}
	var up store.InstanceRecord
	storetest.Eventually(t, 10*time.Second, "the restarted instance to be ready and routed", func() bool {
		up = record(t, srv.Store, rec)
		ev := lastWebEvent(t, srv.Store)
		return up.State == store.InstanceReady && len(ev.Endpoints) == 1 && ev.Endpoints[0].InstanceID == rec.ID
	})
	if up.Restarts != 1 || up.PID == rec.PID || up.Port != rec.Port || up.Error != "" || up.LastExit == "" {
		t.Fatalf("record after the restart: %+v (before %+v)", up, rec)
	}
	if !answers(up) {
		t.Fatal("the restarted instance does not answer")
	}
	if f.agent.restarts.Load() != 1 {
		t.Fatalf("restarts counted: %d", f.agent.restarts.Load())
	}
}

// A command that keeps failing is restarted with a growing backoff and
// shown as such; on-failure leaves a clean exit alone; never leaves it
// failed.
func TestCrashLoopBacksOff(t *testing.T) {
	srv := storetest.Start(t)
	startAgent(t, srv, t.TempDir())
	ctx := context.Background()
	start := func(id string, spec store.ServiceSpec) store.InstanceRecord {
		t.Helper()
		var rep store.StartReply
		req := store.StartRequest{Instance: store.InstanceRecord{ID: id, Namespace: "shop", Service: "web", DeployID: "d1"}, Spec: spec}
		if err := srv.Store.Call(ctx, "m1", store.CmdStartCandidate, req, &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Instance
	}
	loop := start("loop", store.ServiceSpec{Command: []string{"/bin/sh", "-c", "exit 3"}})
	var waits []time.Duration
	var last store.InstanceRecord
	storetest.Eventually(t, 15*time.Second, "four restarts", func() bool {
		got := record(t, srv.Store, loop)
		if got.State == store.InstanceBackoff && got.LastExitAt != last.LastExitAt {
			waits = append(waits, got.NextRestart.Sub(got.LastExitAt))
			last = got
		}
		return got.Restarts >= 4 && len(waits) >= 4
	})
	if last.LastExit != "exited with status 3" || !strings.Contains(last.Error, "exited with status 3; restart") {
		t.Fatalf("crash-looping record: %+v", last)
	}
	// 100ms, 200ms, 400ms, 800ms (capped), each ±20%.
	for i := 1; i < len(waits); i++ {
		if waits[i] < waits[i-1] && waits[i] < 600*time.Millisecond {
			t.Fatalf("backoff did not grow: %v", waits)
		}
	}
	if waits[len(waits)-1] > 960*time.Millisecond {
		t.Fatalf("backoff past its ceiling: %v", waits)
	}
	t.Logf("crash loop backoffs: %v", waits)

	clean := start("clean", store.ServiceSpec{Command: []string{"/bin/sh", "-c", "exit 0"}, Restart: store.RestartOnFailure})
	never := start("never", store.ServiceSpec{Command: []string{"/bin/sh", "-c", "exit 1"}, Restart: store.RestartNever})
	for _, rec := range []store.InstanceRecord{clean, never} {
		storetest.Eventually(t, 5*time.Second, rec.ID+" to be recorded failed", func() bool {
			return record(t, srv.Store, rec).State == store.InstanceFailed
		})
		if got := record(t, srv.Store, rec); got.Restarts != 0 {
			t.Fatalf("%s was restarted: %+v", rec.ID, got)
		}
	}
	// Stopping an instance in backoff cancels its restart.
	if err := srv.Store.Call(ctx, "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: loop.ID, Namespace: "shop", Forget: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := readInstance(ctx, srv.Store, loop.Key(), &last); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a stopped crash loop came back: %+v %v", last, err)
	}
}

// diedWithItsAgentAway starts an instance, stops its agent, and kills the
// instance: what the next agent on dir finds.
func diedWithItsAgentAway(t *testing.T) (*storetest.Server, string, store.InstanceRecord) {
	t.Helper()
	srv := storetest.Start(t)
	dir := t.TempDir()
	f := startAgent(t, srv, dir)
	commitOne(t, srv.Store, "web-0-a")
	rec := startReady(t, srv.Store, "web-0-a", nil)
	f.stop()
	<-f.done
	if err := killPID(rec.PID); err != nil {
		t.Fatal(err)
	}
	return srv, dir, rec
}

// An agent restarted while an instance waits in backoff restarts it.
func TestBackoffSurvivesAnAgentRestart(t *testing.T) {
	srv, dir, rec := diedWithItsAgentAway(t)
	startAgent(t, srv, dir)
	var up store.InstanceRecord
	storetest.Eventually(t, 10*time.Second, "the instance that died with its agent away to run again", func() bool {
		up = record(t, srv.Store, rec)
		return up.State == store.InstanceReady && up.Restarts == 1
	})
	if up.LastExit != "not running after agent restart" || !answers(up) {
		t.Fatalf("after the agent restart: %+v", up)
	}
}

// An instance that died while its agent was away waits for its restart
// with no run behind it: the agent still answers everything about it
// (inventory, readiness, stop) and keeps answering after. Before, the
// inventory dereferenced the missing run while holding the agent's lock:
// the panic was recovered, the lock was not released, and the agent never
// answered again (`control doctor` after `make up` on a box whose
// instances had been killed).
func TestInstanceAwaitingItsRestartAnswersEverything(t *testing.T) {
	srv, dir, rec := diedWithItsAgentAway(t)
	startAgentAlone(t, srv, dir, func(c *Config) { c.RestartBackoff, c.RestartBackoffMax = time.Hour, time.Hour })
	ctx := context.Background()
	storetest.Eventually(t, 5*time.Second, "the instance in backoff", func() bool {
		return record(t, srv.Store, rec).State == store.InstanceBackoff
	})
	var inv store.InventoryReply
	if err := srv.Store.Call(ctx, "m1", store.CmdInventory, struct{}{}, &inv); err != nil {
		t.Fatalf("inventory: %v", err)
	}
	if len(inv.Instances) != 1 || inv.Instances[0].Running {
		t.Fatalf("inventory: %+v", inv.Instances)
	}
	var rr store.ReadinessReply
	if err := srv.Store.Call(ctx, "m1", store.CmdReadiness, store.ReadinessRequest{InstanceID: rec.ID, Timeout: store.Duration(time.Second)}, &rr); err != nil || rr.Ready {
		t.Fatalf("readiness: %+v %v", rr, err)
	}
	if err := srv.Store.Call(ctx, "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: rec.ID, Namespace: rec.Namespace}, nil); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := srv.Store.Call(ctx, "m1", store.CmdInventory, struct{}{}, &inv); err != nil || len(inv.Instances) != 0 {
		t.Fatalf("inventory after the stop: %+v %v", inv.Instances, err)
	}
}
