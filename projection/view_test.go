package projection

import (
	"fmt"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

func upsert(ns, name string, routes ...store.Route) *store.RoutingEvent {
	return &store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: ns, Service: name,
		Routes: routes, Endpoints: []store.Endpoint{{InstanceID: name + "-1", Machine: "m1", Address: "10.100.0.1", Port: 8000}}}
}

// m1 is the machine upsert's endpoints run on.
var m1 = store.MachineRecord{ID: "m1", State: store.MachineActive, Address: "10.100.0.1"}

func route(hosts []string, prefixes ...string) store.Route {
	return store.Route{Hosts: hosts, PathPrefixes: prefixes}
}

func buildView(t *testing.T, evs ...*store.RoutingEvent) *View {
	t.Helper()
	b := newBuilder(emptyView(false))
	b.upsertMachine(m1)
	for i, ev := range evs {
		if err := b.apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	return b.finish(uint64(len(evs)), false)
}

func TestLookup(t *testing.T) {
	v := buildView(t,
		upsert("shop", "web", route([]string{"shop.example.com", "Bücher.example"})),
		upsert("shop", "api", route([]string{"shop.example.com"}, "/api", "/v2/")),
		upsert("shop", "tenants", route([]string{"*.tenants.example.com"})),
		upsert("shop", "all", route([]string{"*.example.com"}, "/")),
		upsert("shop", "only-x", route([]string{"x.example.com"}, "/x")),
	)
	cases := []struct {
		host, path, want string
	}{
		{"shop.example.com", "/", "web"},
		{"shop.example.com", "", "web"},
		{"SHOP.Example.COM.", "/index.html", "web"},
		{"shop.example.com:8080", "/", "web"},
		{"shop.example.com", "/api", "api"},
		{"shop.example.com", "/api/orders", "api"},
		{"shop.example.com", "/apix", "web"}, // segment boundary
		{"shop.example.com", "/v2/x", "api"},
		{"shop.example.com", "/v2", "web"}, // "/v2/" needs the slash
		{"a.tenants.example.com", "/", "tenants"},
		{"b.a.tenants.example.com", "/", "tenants"},
		{"tenants.example.com", "/", "all"},
		{"other.example.com", "/", "all"},
		{"x.example.com", "/x/1", "only-x"},
		{"x.example.com", "/y", "all"}, // exact host without a matching prefix falls to the wildcard
		{"xn--bcher-kva.example", "/", "web"},
		{"bücher.example", "/", "web"},
		{"example.com", "/", ""},
		{"unknown.test", "/", ""},
		{"", "/", ""},
		{":8080", "/", ""},
	}
	for _, c := range cases {
		s, ok := v.Lookup(c.host, c.path)
		got := ""
		if ok {
			got = s.Name
		}
		if got != c.want {
			t.Errorf("Lookup(%q, %q) = %q, want %q", c.host, c.path, got, c.want)
		}
	}
	if !v.Routes("anything.example.com") || v.Routes("example.org") {
		t.Errorf("Routes: wildcard host should be routed, unknown should not")
	}
	svcs, eps, _ := v.Counts()
	if svcs != 5 || eps != 5 {
		t.Errorf("counts = %d services %d endpoints, want 5 and 5", svcs, eps)
	}
	hosts := v.Hosts()
	want := []string{"*.example.com", "*.tenants.example.com", "shop.example.com", "x.example.com", "xn--bcher-kva.example"}
	if len(hosts) != len(want) {
		t.Fatalf("Hosts() = %v, want %v", hosts, want)
	}
	for i := range want {
		if hosts[i] != want[i] {
			t.Fatalf("Hosts() = %v, want %v", hosts, want)
		}
	}
}

func TestUpsertReplacesAndRemoveDrops(t *testing.T) {
	base := buildView(t,
		upsert("a", "web", route([]string{"a.test"})),
		upsert("b", "web", route([]string{"b.test"})),
	)
	b := newBuilder(base)
	// web moves from a.test to c.test: a.test must stop routing.
	if err := b.apply(upsert("a", "web", route([]string{"c.test"}))); err != nil {
		t.Fatal(err)
	}
	if err := b.apply(&store.RoutingEvent{Kind: store.EventServiceRemove, Namespace: "b", Service: "web"}); err != nil {
		t.Fatal(err)
	}
	next := b.finish(3, false)
	if _, ok := next.Lookup("a.test", "/"); ok {
		t.Error("a.test still routed after its service moved to c.test")
	}
	if s, ok := next.Lookup("c.test", "/"); !ok || s.Namespace != "a" {
		t.Error("c.test not routed to a/web")
	}
	if _, ok := next.Lookup("b.test", "/"); ok {
		t.Error("b.test still routed after removal")
	}
	if n, _, _ := next.Counts(); n != 1 {
		t.Errorf("services = %d, want 1", n)
	}
	// The base view is immutable: it still answers as before.
	if _, ok := base.Lookup("a.test", "/"); !ok {
		t.Error("base view changed: a.test no longer routed")
	}
	if _, ok := base.Lookup("b.test", "/"); !ok {
		t.Error("base view changed: b.test no longer routed")
	}
}

func TestConflictingRoutesDecideAlike(t *testing.T) {
	// Two services claim the same host and prefix: the lower key wins, in
	// whichever order the events came.
	e1 := upsert("ns", "b", route([]string{"same.test"}))
	e2 := upsert("ns", "a", route([]string{"same.test"}))
	for _, order := range [][]*store.RoutingEvent{{e1, e2}, {e2, e1}} {
		v := buildView(t, order...)
		if s, _ := v.Lookup("same.test", "/"); s == nil || s.Name != "a" {
			t.Errorf("conflict resolved to %v, want ns/a", s)
		}
	}
}

func TestBadEventsAreRejected(t *testing.T) {
	b := newBuilder(emptyView(false))
	for _, ev := range []*store.RoutingEvent{
		{Kind: "service.explode", Namespace: "a", Service: "b"},
		{Kind: store.EventServiceUpsert, Namespace: "", Service: "b"},
		{Kind: store.EventServiceRemove, Namespace: "a"},
		{Kind: store.EventMachineUpsert},
		{Kind: store.EventMachineRemove, Machine: &store.MachineRecord{}},
	} {
		if err := b.apply(ev); err == nil {
			t.Errorf("event %+v accepted", ev)
		}
	}
	if v := b.finish(1, false); v.numServices != 0 || v.numMachines != 0 {
		t.Errorf("bad events changed the view")
	}
}

func TestMachines(t *testing.T) {
	b := newBuilder(emptyView(false))
	for _, id := range []string{"m2", "m1", "m3"} {
		if err := b.apply(&store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: &store.MachineRecord{ID: id, Address: "10.100.0.9"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.apply(&store.RoutingEvent{Kind: store.EventMachineRemove, Machine: &store.MachineRecord{ID: "m3"}}); err != nil {
		t.Fatal(err)
	}
	v := b.finish(4, false)
	ms := v.Machines()
	if len(ms) != 2 || ms[0].ID != "m1" || ms[1].ID != "m2" {
		t.Fatalf("Machines() = %+v", ms)
	}
	if _, ok := v.Machine("m3"); ok {
		t.Error("m3 still present after removal")
	}
}

// A host two namespaces route (records the store's ownership check should
// have kept out) is served by one of them only, the same on every gateway
// whatever order the events came in, and reported.
func TestHostOfTwoNamespacesIsServedByItsOwnerOnly(t *testing.T) {
	prod := upsert("prod", "api", route([]string{"api.example.com"}, "/"))
	test := upsert("test", "api", route([]string{"api.example.com"}, "/v2", "/"))
	testOnly := upsert("test", "web", route([]string{"test.example.com"}))
	a := buildView(t, prod, test, testOnly)
	b := buildView(t, testOnly, test, prod)
	for _, v := range []*View{a, b} {
		for _, path := range []string{"/", "/v2/orders"} {
			s, ok := v.Lookup("API.Example.COM.", path)
			if !ok || s.Namespace != "prod" {
				t.Fatalf("api.example.com%s served by %+v, want prod's", path, s)
			}
		}
		if rs := v.HostRoutes("api.example.com"); len(rs) != 1 || rs[0].Namespace != "prod" {
			t.Fatalf("HostRoutes = %+v, want prod's route only", rs)
		}
		cs := v.Conflicts()
		if len(cs) != 1 || cs[0].Host != "api.example.com" || cs[0].Owner != "prod" || len(cs[0].Others) != 1 || cs[0].Others[0] != "test" {
			t.Fatalf("Conflicts = %+v", cs)
		}
	}
	if a.Digest() != b.Digest() {
		t.Fatalf("the same routing in another order has another digest")
	}
	// The owner stops routing it: the other namespace is served.
	bd := newBuilder(a)
	if err := bd.apply(&store.RoutingEvent{Version: 1, Kind: store.EventServiceRemove, Namespace: "prod", Service: "api"}); err != nil {
		t.Fatal(err)
	}
	c := bd.finish(a.Seq+1, false)
	if s, ok := c.Lookup("api.example.com", "/v2/x"); !ok || s.Namespace != "test" {
		t.Fatalf("after prod's removal served by %+v", s)
	}
	if len(c.Conflicts()) != 0 || c.Digest() == a.Digest() {
		t.Fatalf("conflicts %+v, digest unchanged %v", c.Conflicts(), c.Digest() == a.Digest())
	}
	// A healthy view reports nothing.
	if cs := buildView(t, prod, testOnly).Conflicts(); len(cs) != 0 {
		t.Fatalf("conflicts on a coherent view: %+v", cs)
	}
}

// BenchmarkBatchApply measures applying upserts to views of 1,000 to
// 100,000 services in the batches a projection swaps in (512 events, each
// of a different service), without NATS or signatures: what a batch costs
// beside its events, the copy-on-write of the indexes it touches, grows
// with the view only as far as the touched shards do.
func BenchmarkBatchApply(b *testing.B) {
	events := func(n int, rev int64) []store.RoutingEvent {
		evs := make([]store.RoutingEvent, n)
		for i := range evs {
			evs[i] = store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "bench", Service: fmt.Sprintf("svc%d", i), Revision: rev,
				Routes:    []store.Route{{Hosts: []string{fmt.Sprintf("svc%d.example.com", i), fmt.Sprintf("*.svc%d.example.com", i)}}},
				Endpoints: []store.Endpoint{{InstanceID: "a", Machine: "m1", Address: "10.100.0.1", Port: 8000}}}
		}
		return evs
	}
	for _, size := range []int{1000, 10_000, 100_000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			bl := newBuilder(emptyView(false))
			bl.upsertMachine(m1)
			for _, ev := range events(size, 1) {
				if err := bl.apply(&ev); err != nil {
					b.Fatal(err)
				}
			}
			v := bl.finish(1, false)
			next := events(size, 2)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += maxBatch {
				bl := newBuilder(v)
				for j := i; j < min(i+maxBatch, b.N); j++ {
					if err := bl.apply(&next[(j*7919)%size]); err != nil {
						b.Fatal(err)
					}
				}
				v = bl.finish(uint64(i), false)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkMachineEvents measures a batch holding one machine event, in
// views of 10,000 and 100,000 services spread over 500 machines: "move"
// (a known machine's address changes) looks through every service for
// its endpoints and admits those again (here 1 service in 500); "join"
// (a machine new to the view) looks only at services with endpoints set
// aside (here none).
func BenchmarkMachineEvents(b *testing.B) {
	for _, size := range []int{10_000, 100_000} {
		bl := newBuilder(emptyView(false))
		for m := range 500 {
			bl.upsertMachine(store.MachineRecord{ID: fmt.Sprintf("m%d", m), Address: fmt.Sprintf("10.100.%d.%d", m/250, m%250+1)})
		}
		for i := range size {
			m := i % 500
			ev := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "bench", Service: fmt.Sprintf("svc%d", i),
				Routes:    []store.Route{{Hosts: []string{fmt.Sprintf("svc%d.example.com", i)}}},
				Endpoints: []store.Endpoint{{InstanceID: "a", Machine: fmt.Sprintf("m%d", m), Address: fmt.Sprintf("10.100.%d.%d", m/250, m%250+1), Port: 8000}}}
			if err := bl.apply(&ev); err != nil {
				b.Fatal(err)
			}
		}
		base := bl.finish(1, false)
		for _, kind := range []string{"move", "join"} {
			b.Run(fmt.Sprintf("%s/%d", kind, size), func(b *testing.B) {
				v := base
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					bl := newBuilder(v)
					if kind == "move" {
						bl.upsertMachine(store.MachineRecord{ID: "m7", Address: fmt.Sprintf("10.101.0.%d", i%250+1)})
					} else {
						bl.upsertMachine(store.MachineRecord{ID: fmt.Sprintf("new%d", i), Address: "10.102.0.1"})
					}
					v = bl.finish(uint64(i), false)
				}
			})
		}
	}
}
