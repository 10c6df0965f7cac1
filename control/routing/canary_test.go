package routing_test

import (
	"context"
	"testing"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A canary step routes a changed service to the live instances and the
// candidates split by its weight, keeps an unchanged service as it is and
// gives a new one everything; republishing during the canary keeps the
// split, and after an abort commit the live commit alone is routed again.
func TestCanaryRouting(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	spec := func(v string) store.ServiceSpec { return store.ServiceSpec{Env: map[string]string{"V": v}} }
	live := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": spec("1"), "api": spec("1"), "gone": spec("1")}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w1", Machine: "m1", Revision: 1},
			{Service: "api", Slot: 0, InstanceID: "a1", Machine: "m1", Revision: 1},
			{Service: "gone", Slot: 0, InstanceID: "g1", Machine: "m1", Revision: 1},
		}}
	cp := &store.DeployCommit{ID: "d2", Namespace: "shop", Kind: store.CommitCheckpoint, Phase: "canary-1", Revision: 2,
		Canary: &store.Canary{Step: 1, Weight: 10},
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": spec("2"), "api": spec("1"), "new": spec("2")},
			Rollout: &store.CanarySpec{Steps: []store.CanaryStep{{Weight: 10}}, Sticky: true}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w2", Machine: "m1", Revision: 2},
			{Service: "api", Slot: 0, InstanceID: "a1", Machine: "m1", Revision: 1},
			{Service: "new", Slot: 0, InstanceID: "n2", Machine: "m1", Revision: 2},
		}}
	insts := map[string]*store.InstanceRecord{}
	for i, id := range []string{"w1", "a1", "g1", "w2", "n2"} {
		rev := int64(1)
		if id[1] == '2' {
			rev = 2
		}
		insts[id] = &store.InstanceRecord{ID: id, Namespace: "shop", Service: map[byte]string{'w': "web", 'a': "api", 'g': "gone", 'n': "new"}[id[0]],
			Revision: rev, Machine: "m1", Address: "127.0.0.1", Port: 9000 + i, State: store.InstanceReady, Version: store.RecordVersion}
	}
	m1 := &store.MachineRecord{ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}
	if err := s.CreateMachine(ctx, m1); err != nil {
		t.Fatal(err)
	}
	src := &routing.Source{Instances: insts, Machines: map[string]*store.MachineRecord{"m1": m1}}
	events := routing.CanaryEvents(cp, live, src)
	byService := map[string]store.RoutingEvent{}
	for _, ev := range events {
		byService[ev.Service] = ev
	}
	if len(events) != 3 {
		t.Fatalf("events: %+v", events)
	}
	web := byService["web"]
	if sp := web.Split; sp == nil || sp.Deploy != "d2" || sp.Revision != 2 || sp.From != 1 || sp.Weight != 10 || !sp.Sticky || len(web.Endpoints) != 2 {
		t.Fatalf("web during the canary: %+v split %+v", web, web.Split)
	}
	if api := byService["api"]; api.Split != nil || len(api.Endpoints) != 1 || api.DeployID != "d1" {
		t.Fatalf("api (unchanged) during the canary: %+v", api)
	}
	if n := byService["new"]; n.Split != nil || len(n.Endpoints) != 1 {
		t.Fatalf("a service new in the canary: %+v", n)
	}

	// Stored: Commits sees the canary, republish keeps the split.
	for _, in := range insts {
		if _, err := s.PutInstance(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AppendCommit(ctx, live); err != nil {
		t.Fatal(err)
	}
	if _, c, err := routing.Commits(ctx, s, "shop"); err != nil || c != nil {
		t.Fatalf("before the canary: %v %v", c, err)
	}
	if _, err := s.AppendCommit(ctx, cp); err != nil {
		t.Fatal(err)
	}
	l, c, err := routing.Commits(ctx, s, "shop")
	if err != nil || l == nil || l.ID != "d1" || c == nil || c.ID != "d2" {
		t.Fatalf("during the canary: live %v canary %v err %v", l, c, err)
	}
	republished := func(service string) *store.RoutingEvent {
		t.Helper()
		seq, err := routing.RepublishService(ctx, s, "shop", service)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.LoadRouting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range st.Services {
			if ev := &st.Services[i]; ev.Service == service && ev.Seq == seq {
				return ev
			}
		}
		t.Fatalf("republished %s not found at %d", service, seq)
		return nil
	}
	if ev := republished("web"); ev.Split == nil || len(ev.Endpoints) != 2 {
		t.Fatalf("republished during the canary: %+v", ev)
	}
	if ev := republished("gone"); ev.Split != nil || len(ev.Endpoints) != 1 {
		t.Fatalf("a service the canary drops, republished: %+v", ev)
	}
	abort := *cp
	abort.Phase, abort.Canary = "canary-1-abort", &store.Canary{Step: 1, Abort: true}
	if _, err := s.AppendCommit(ctx, &abort); err != nil {
		t.Fatal(err)
	}
	if _, c, err := routing.Commits(ctx, s, "shop"); err != nil || c != nil {
		t.Fatalf("after the abort: %v %v", c, err)
	}
	if ev := republished("web"); ev.Split != nil || len(ev.Endpoints) != 1 || ev.Endpoints[0].InstanceID != "w1" {
		t.Fatalf("republished after the abort: %+v", ev)
	}
}
