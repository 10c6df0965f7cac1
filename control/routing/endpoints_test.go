package routing_test

import (
	"context"
	"testing"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The routing the control plane derives and signs takes an endpoint's IP
// from its machine's record whatever the agent wrote in its instance
// record: loopback, cloud metadata, another machine's address or nothing
// at all; only the port is the agent's. An instance whose machine is not
// a member is not routed.
func TestEndpointsComeFromMachineRecords(t *testing.T) {
	live := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w1", Machine: "m1", Revision: 1},
			{Service: "web", Slot: 1, InstanceID: "w2", Machine: "m2", Revision: 1},
		}}
	machines := map[string]*store.MachineRecord{
		"m1": {ID: "m1", Address: "10.100.0.1"},
		"m2": {ID: "m2", Address: "10.100.0.2"},
	}
	for _, written := range []string{"10.100.0.1", "127.0.0.1", "169.254.169.254", "fe80::1", "0.0.0.0", "224.0.0.1", "10.100.0.2", ""} {
		insts := map[string]*store.InstanceRecord{
			"w1": {ID: "w1", Namespace: "shop", Service: "web", Revision: 1, Machine: "m1", Address: written, Port: 9001, State: store.InstanceReady},
			"w2": {ID: "w2", Namespace: "shop", Service: "web", Revision: 1, Machine: "m2", Address: "10.100.0.2", Port: 9002, State: store.InstanceReady},
		}
		evs := routing.CommitEvents(live, nil, &routing.Source{Instances: insts, Machines: machines})
		if len(evs) != 1 || len(evs[0].Endpoints) != 2 {
			t.Fatalf("instance address %q: events %+v", written, evs)
		}
		for _, ep := range evs[0].Endpoints {
			if want := machines[ep.Machine].Address; ep.Address != want || store.CheckEndpoint(&ep, machines[ep.Machine]) != nil {
				t.Fatalf("instance address %q: endpoint %+v, want it at %s", written, ep, want)
			}
		}
		if evs[0].Endpoints[0].Port != 9001 {
			t.Fatalf("the agent's port was not taken: %+v", evs[0].Endpoints[0])
		}
	}
	// Without m2's record, w2 is not routed.
	insts := map[string]*store.InstanceRecord{
		"w1": {ID: "w1", Namespace: "shop", Service: "web", Revision: 1, Machine: "m1", Port: 9001, State: store.InstanceReady},
		"w2": {ID: "w2", Namespace: "shop", Service: "web", Revision: 1, Machine: "m2", Port: 9002, State: store.InstanceReady},
	}
	ev := routing.ServiceUpsert(live, "web", &routing.Source{Instances: insts, Machines: map[string]*store.MachineRecord{"m1": machines["m1"]}})
	if len(ev.Endpoints) != 1 || ev.Endpoints[0].InstanceID != "w1" {
		t.Fatalf("an instance of a machine that is no member was routed: %+v", ev.Endpoints)
	}
}

// A republish an agent asks for is derived from the machine records in
// the store: an agent that rewrote its instance record's address gets
// its endpoint published at its machine's admitted address, still.
func TestRepublishTakesTheAdmittedAddress(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if _, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.example.com"}}}, Instances: []storetest.Instance{
			{ID: "w1", Machine: "m1", Address: "10.100.0.1", Port: 9001},
			{ID: "w2", Machine: "m2", Address: "10.100.0.2", Port: 9002},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	stop, err := routing.ServeRepublish(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	key := store.InstanceKey("shop", "m1", "w1")
	for _, addr := range []string{"127.0.0.1", "169.254.169.254", "10.100.0.2"} {
		rec, _, err := s.GetInstance(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		rec.Address = addr
		if _, err := s.PutInstance(ctx, rec); err != nil {
			t.Fatal(err)
		}
		ev := republished(t, s, s, "m1", "shop", "web")
		got := map[string]string{}
		for _, ep := range ev.Endpoints {
			got[ep.InstanceID] = ep.Address
		}
		if len(got) != 2 || got["w1"] != "10.100.0.1" || got["w2"] != "10.100.0.2" {
			t.Fatalf("instance record at %s, republished %v", addr, got)
		}
	}
}
