package routing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A service's locality and slow start travel with every upsert derived
// from its spec: a final commit's, a canary step's and a republish's, as
// stored and read back; a service without them carries none (the
// default policy).
func TestUpsertsCarryLocality(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	loc := &store.Locality{Policy: store.LocalityPrefer, Order: []string{"fra", "ams"}}
	web := store.ServiceSpec{Command: []string{"web"}, Locality: loc, SlowStart: store.Duration(30 * time.Second)}
	live := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": web, "api": {Command: []string{"api"}}}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w1", Machine: "m1", Revision: 1},
			{Service: "api", Slot: 0, InstanceID: "a1", Machine: "m1", Revision: 1},
		}}
	m1 := &store.MachineRecord{ID: "m1", State: store.MachineActive, Address: "127.0.0.1", Region: "fra"}
	if err := s.CreateMachine(ctx, m1); err != nil {
		t.Fatal(err)
	}
	insts := map[string]*store.InstanceRecord{}
	for i, id := range []string{"w1", "a1", "w2"} {
		svc, rev := "web", int64(1)
		if id == "a1" {
			svc = "api"
		}
		if id == "w2" {
			rev = 2
		}
		insts[id] = &store.InstanceRecord{Version: store.RecordVersion, ID: id, Namespace: "shop", Service: svc, Revision: rev,
			Machine: "m1", Address: "127.0.0.1", Port: 9000 + i, State: store.InstanceReady}
		if _, err := s.PutInstance(ctx, insts[id]); err != nil {
			t.Fatal(err)
		}
	}
	src := &routing.Source{Instances: insts, Machines: map[string]*store.MachineRecord{"m1": m1}}
	carries := func(what string, ev store.RoutingEvent) {
		t.Helper()
		switch ev.Service {
		case "web":
			if ev.Locality == nil || ev.Locality.Policy != store.LocalityPrefer || !slices.Equal(ev.Locality.Order, loc.Order) ||
				ev.SlowStart != web.SlowStart {
				t.Fatalf("%s: web's upsert carries locality %+v slow start %s, want %+v and %s", what, ev.Locality, ev.SlowStart, loc, web.SlowStart)
			}
		case "api":
			if ev.Locality != nil || ev.SlowStart != 0 {
				t.Fatalf("%s: api's upsert carries locality %+v slow start %s, want none", what, ev.Locality, ev.SlowStart)
			}
		}
	}
	for _, ev := range routing.CommitEvents(live, nil, src) {
		carries("commit", ev)
	}
	if _, err := s.AppendCommit(ctx, live); err != nil {
		t.Fatal(err)
	}
	// A canary step of a changed web: split, and still web's locality.
	web2 := web
	web2.Env = map[string]string{"V": "2"}
	cp := &store.DeployCommit{ID: "d2", Namespace: "shop", Kind: store.CommitCheckpoint, Phase: "canary-1", Revision: 2,
		Canary:   &store.Canary{Step: 1, Weight: 10},
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": web2, "api": live.Manifest.Services["api"]}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w2", Machine: "m1", Revision: 2},
			{Service: "api", Slot: 0, InstanceID: "a1", Machine: "m1", Revision: 1},
		}}
	evs := routing.CanaryEvents(cp, live, src)
	for _, ev := range evs {
		carries("canary step", ev)
		if ev.Service == "web" && ev.Split == nil {
			t.Fatalf("canary step: web is not split: %+v", ev)
		}
	}
	for _, service := range []string{"web", "api"} {
		seq, err := routing.RepublishService(ctx, s, "shop", service)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.LoadRouting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(st.Services, func(ev store.RoutingEvent) bool { return ev.Service == service && ev.Seq == seq })
		if i < 0 {
			t.Fatalf("republished %s not found at %d", service, seq)
		}
		carries("republish, read back", st.Services[i])
	}
}
