package store_test

import (
	"context"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A reader dials an endpoint only at its machine's admitted address: a
// loopback, link-local, unspecified or multicast address only when the
// machine was admitted at that very address (the single box on
// 127.0.0.1), and never another machine's address.
func TestCheckEndpoint(t *testing.T) {
	m1 := &store.MachineRecord{ID: "m1", Address: "10.100.0.1"}
	m2 := &store.MachineRecord{ID: "m2", Address: "10.100.0.2"}
	box := &store.MachineRecord{ID: "box", Address: "127.0.0.1"}
	v6 := &store.MachineRecord{ID: "v6", Address: "fd00::1"}
	for _, tc := range []struct {
		name    string
		machine *store.MachineRecord
		addr    string
		port    int
		reason  string // "" when dialled
	}{
		{"its own admitted address", m1, "10.100.0.1", 8080, ""},
		{"its own address, v4-mapped", m1, "::ffff:10.100.0.1", 8080, ""},
		{"its own v6 address", v6, "fd00::1", 8080, ""},
		{"the single box on loopback", box, "127.0.0.1", 8080, ""},
		{"another machine's address", m1, m2.Address, 8080, store.EndpointNotAdmitted},
		{"a public address", m1, "203.0.113.9", 80, store.EndpointNotAdmitted},
		{"loopback", m1, "127.0.0.1", 18191, store.EndpointSpecialAddress},
		{"another loopback address on the single box", box, "127.0.0.2", 8080, store.EndpointSpecialAddress},
		{"v6 loopback", m1, "::1", 8080, store.EndpointSpecialAddress},
		{"link-local: cloud metadata", m1, "169.254.169.254", 80, store.EndpointSpecialAddress},
		{"link-local v6", m1, "fe80::1", 80, store.EndpointSpecialAddress},
		{"link-local v6 with a zone", m1, "fe80::1%eth0", 80, store.EndpointBadAddress},
		{"unspecified", m1, "0.0.0.0", 8080, store.EndpointSpecialAddress},
		{"unspecified v6", m1, "::", 8080, store.EndpointSpecialAddress},
		{"multicast", m1, "224.0.0.1", 8080, store.EndpointSpecialAddress},
		{"multicast v6", m1, "ff02::1", 8080, store.EndpointSpecialAddress},
		{"a machine the reader does not hold", nil, "10.100.0.1", 8080, store.EndpointUnknownMachine},
		{"not an IP address", m1, "metadata.google.internal", 80, store.EndpointBadAddress},
		{"no port", m1, "10.100.0.1", 0, store.EndpointBadAddress},
		{"a port past 65535", m1, "10.100.0.1", 70000, store.EndpointBadAddress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "m1"
			if tc.machine != nil {
				id = tc.machine.ID
			}
			ep := store.Endpoint{InstanceID: "i1", Machine: id, Address: tc.addr, Port: tc.port}
			err := store.CheckEndpoint(&ep, tc.machine)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && (!store.HasCode(err, store.CodeInvalid) || store.AsError(err).Detail["reason"] != tc.reason):
				t.Fatalf("got %v, want a refusal for %s", err, tc.reason)
			}
		})
	}
	// A record filed for another machine admits nothing of this one.
	if err := store.CheckEndpoint(&store.Endpoint{InstanceID: "i1", Machine: "m1", Address: m2.Address, Port: 80}, m2); err == nil {
		t.Fatal("m2's record admitted an endpoint of m1")
	}
}

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
		evs := store.CommitEvents(live, nil, &store.RoutingSource{Instances: insts, Machines: machines})
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
	ev := store.ServiceUpsert(live, "web", &store.RoutingSource{Instances: insts, Machines: map[string]*store.MachineRecord{"m1": machines["m1"]}})
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
	stop, err := s.ServeRepublish(ctx)
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
		seq, err := s.RequestRepublish(ctx, "m1", "shop", "web")
		if err != nil {
			t.Fatal(err)
		}
		msg, err := store.StreamOf(s, s.Names.RoutingEventsStream()).GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev store.RoutingEvent
		if err := store.Decode("routing event", msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, ep := range ev.Endpoints {
			got[ep.InstanceID] = ep.Address
		}
		if len(got) != 2 || got["w1"] != "10.100.0.1" || got["w2"] != "10.100.0.2" {
			t.Fatalf("instance record at %s, republished %v", addr, got)
		}
	}
}
