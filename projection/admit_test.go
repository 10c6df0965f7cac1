package projection_test

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// admitCases are the endpoints of one signed upsert, on m1 (admitted at
// 10.100.0.1), m2 (10.100.0.2) and box (the single box, 127.0.0.1), and
// whether a gateway dials each.
var admitCases = []struct {
	id, machine, addr string
	dialled           bool
}{
	{"own", "m1", "10.100.0.1", true},
	{"m2-own", "m2", "10.100.0.2", true},
	{"single-box", "box", "127.0.0.1", true},
	{"loopback", "m1", "127.0.0.1", false},
	{"loopback-v6", "m1", "::1", false},
	{"other-loopback-on-box", "box", "127.0.0.2", false},
	{"metadata", "m1", "169.254.169.254", false},
	{"link-local-v6", "m1", "fe80::1", false},
	{"unspecified", "m1", "0.0.0.0", false},
	{"unspecified-v6", "m1", "::", false},
	{"multicast", "m1", "224.0.0.1", false},
	{"multicast-v6", "m1", "ff02::1", false},
	{"another-machines", "m1", "10.100.0.2", false},
	{"unknown-machine", "m9", "10.100.0.9", false},
}

func admitMachines() []store.MachineRecord {
	return []store.MachineRecord{
		{Version: 1, ID: "m1", State: store.MachineActive, Address: "10.100.0.1"},
		{Version: 1, ID: "m2", State: store.MachineActive, Address: "10.100.0.2"},
		{Version: 1, ID: "box", State: store.MachineActive, Address: "127.0.0.1"},
	}
}

func admitUpsert() store.RoutingEvent {
	ev := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web", DeployID: "d1", Revision: 1,
		Routes: []store.Route{{Hosts: []string{"shop.example.com"}}}, At: time.Now().UTC()}
	for i, c := range admitCases {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: c.id, Machine: c.machine, Slot: i, Revision: 1, Address: c.addr, Port: 8080})
	}
	return ev
}

// dialled are the IDs of the admitCases a gateway dials, as endpointIDs
// lists them, and how many it refuses.
func dialled() (ids string, refused int) {
	var in []string
	for _, c := range admitCases {
		if c.dialled {
			in = append(in, c.id)
		}
	}
	return strings.Join(in, ","), len(admitCases) - len(in)
}

// A gateway checks every endpoint of a signed upsert against the machine
// records it holds: it dials one only at its machine's admitted address
// (loopback only on a machine admitted at that loopback address), whatever
// order the service and its machines came in, counts and reports the
// others, and serves the rest of the service.
func TestEndpointsAreAdmittedByTheirMachines(t *testing.T) {
	want, refused := dialled()
	// Machines after the service, as a load reads them, and before.
	for _, order := range []string{"service first", "machines first"} {
		t.Run(order, func(t *testing.T) {
			var evs []store.RoutingEvent
			for _, m := range admitMachines() {
				evs = append(evs, store.RoutingEvent{Version: 1, Kind: store.EventMachineUpsert, Machine: &m})
			}
			if order == "service first" {
				evs = append([]store.RoutingEvent{admitUpsert()}, evs...)
			} else {
				evs = append(evs, admitUpsert())
			}
			v, err := projection.BuildView(evs)
			if err != nil {
				t.Fatal(err)
			}
			s, ok := v.Service("shop", "web")
			if !ok || endpointIDs(s) != want {
				t.Fatalf("dialled %q, want %q", endpointIDs(s), want)
			}
			if _, n, _ := v.Counts(); n != len(admitCases)-refused || v.SetAside() != refused {
				t.Fatalf("counts: %d routable, %d set aside; want %d and %d", n, v.SetAside(), len(admitCases)-refused, refused)
			}
		})
	}
	// The view a doctor rebuilds from stored state names each refusal.
	ev := admitUpsert()
	v, errs := projection.FromState(&store.RoutingState{Seq: 1, Services: []store.RoutingEvent{ev}, Machines: admitMachines()})
	if s, _ := v.Service("shop", "web"); endpointIDs(s) != want || len(errs) != refused {
		t.Fatalf("FromState: dialled %q, %d errors (%v); want %q and %d", endpointIDs(s), len(errs), errs, want, refused)
	}
}

// Over a real store with signed events: an upsert signed by the control
// plane that names addresses its machines were not admitted at (an older
// control plane's derivation, a bug) is applied with those endpoints set
// aside, counted and reported; a machine that moves takes its endpoints
// out of the dialled set until they are published at its new address,
// and a machine that joins after a service names it lets its endpoints
// in.
func TestSignedEndpointsAreCheckedAtTheReader(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	var evs []store.RoutingEvent
	for _, m := range admitMachines() {
		evs = append(evs, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: &m})
	}
	evs = append(evs, admitUpsert())
	seq, err := srv.Store.PublishRouting(ctx, "", evs)
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	want, refused := dialled()
	if s, ok := p.View().Service("shop", "web"); !ok || endpointIDs(s) != want {
		t.Fatalf("dialled %q, want %q", endpointIDs(s), want)
	}
	st := p.Status()
	if st.Endpoints.SetAside != refused || st.Endpoints.Refused != uint64(refused) || st.Endpoints.LastRefusal == "" || st.Signatures.Refused != 0 || st.BadEvents != 0 {
		t.Fatalf("status %+v, want %d endpoints set aside and refused, no event refused", st.Endpoints, refused)
	}

	// m1 moves: its endpoint at the old address is no longer dialled...
	moved := store.MachineRecord{Version: 1, ID: "m1", State: store.MachineActive, Address: "10.100.0.11"}
	seq, err = srv.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: &moved}})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "m2-own,single-box" {
		t.Fatalf("after m1 moved: dialled %q", endpointIDs(s))
	}
	// ... until the service is published at its new one.
	ev := store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web", DeployID: "d1", Revision: 1,
		Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
		Endpoints: []store.Endpoint{
			{InstanceID: "own", Machine: "m1", Address: "10.100.0.11", Port: 8080},
			{InstanceID: "late", Machine: "m7", Address: "10.100.0.7", Port: 8080},
		}}
	if seq, err = srv.Store.PublishRouting(ctx, "", []store.RoutingEvent{ev}); err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "own" {
		t.Fatalf("published at m1's new address: dialled %q", endpointIDs(s))
	}
	// m7 joins after the service named it.
	m7 := store.MachineRecord{Version: 1, ID: "m7", State: store.MachineActive, Address: "10.100.0.7"}
	if seq, err = srv.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: &m7}}); err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p.Projection, seq)
	if s, _ := p.View().Service("shop", "web"); endpointIDs(s) != "own,late" || p.Status().Endpoints.SetAside != 0 {
		t.Fatalf("after m7 joined: dialled %q, %d set aside", endpointIDs(s), p.Status().Endpoints.SetAside)
	}
	// A rebuild from stored state serves the same.
	p2 := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "the second projection's load", func() bool { return p2.Status().Loads == 1 })
	if s, _ := p2.View().Service("shop", "web"); endpointIDs(s) != "own,late" || p2.View().Digest() != p.View().Digest() {
		t.Fatalf("loaded: dialled %q", endpointIDs(s))
	}
}
