package projection

import (
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

func l4upsert(ns, name string, l4 store.Layer4) *store.RoutingEvent {
	ev := upsert(ns, name)
	ev.Layer4 = l4
	return ev
}

func TestLayer4Index(t *testing.T) {
	tcp := func(ports ...int) []store.L4Port {
		var out []store.L4Port
		for _, p := range ports {
			out = append(out, store.L4Port{Port: p})
		}
		return out
	}
	v := buildView(t,
		l4upsert("zeta", "db", store.Layer4{TCP: tcp(5432)}),
		l4upsert("alpha", "db", store.Layer4{TCP: tcp(5432, 6379), UDP: tcp(5353)}),
		l4upsert("alpha", "tls", store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{"DB.example.com.", "*.bad.example"}}}),
		l4upsert("alpha", "reserved", store.Layer4{TCP: tcp(443, 2019)}),
		upsert("alpha", "web", route([]string{"web.example.com"})),
	)
	x := v.Layer4()
	var got []string
	for _, e := range x.Ports() {
		got = append(got, e.String()+"="+e.Service.Key())
	}
	want := []string{"tcp/5432=alpha/db", "tcp/6379=alpha/db", "udp/5353=alpha/db"}
	if len(got) != len(want) {
		t.Fatalf("ports %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ports %v, want %v", got, want)
		}
	}
	if s, ok := x.Port(store.PortKey{Proto: store.ProtoUDP, Port: 5353}); !ok || s.Key() != "alpha/db" {
		t.Errorf("udp/5353: %v %v", s, ok)
	}
	if _, ok := x.Port(store.PortKey{Proto: store.ProtoUDP, Port: 5432}); ok {
		t.Error("udp/5432 routed: only tcp/5432 is exposed")
	}
	if s, ok := x.Passthrough("db.EXAMPLE.com"); !ok || s.Key() != "alpha/tls" {
		t.Errorf("passthrough db.example.com: %v %v", s, ok)
	}
	if _, ok := x.Passthrough("x.bad.example"); ok {
		t.Error("a wildcard passthrough host was indexed")
	}
	if c := x.Conflicts(); len(c) != 1 || c[0].Entry != "tcp/5432" || c[0].Owner != "alpha/db" || c[0].Others[0] != "zeta/db" {
		t.Errorf("conflicts %+v", c)
	}

	// Removing the owner hands the port to the other namespace; a view
	// without layer-4 services has an empty index.
	b := newBuilder(v)
	if err := b.apply(&store.RoutingEvent{Version: 1, Kind: store.EventServiceRemove, Namespace: "alpha", Service: "db"}); err != nil {
		t.Fatal(err)
	}
	v2 := b.finish(v.Seq+1, false)
	if s, ok := v2.Layer4().Port(store.PortKey{Proto: store.ProtoTCP, Port: 5432}); !ok || s.Key() != "zeta/db" {
		t.Errorf("after removal tcp/5432: %v %v", s, ok)
	}
	if len(v.Layer4().Ports()) != 3 {
		t.Error("the base view's index changed")
	}
	if !buildView(t, upsert("a", "web", route([]string{"a.example"}))).Layer4().Empty() {
		t.Error("index of a view without layer-4 services is not empty")
	}
	if v.Digest() == v2.Digest() {
		t.Error("digest did not change with the layer-4 entries")
	}
}

// A gateway's observation names its layer-4 conflicts after its host
// conflicts, in the form doctor reads ("tcp/5432: owner over others").
func TestReportedConflictsNameLayer4(t *testing.T) {
	v := buildView(t,
		upsert("a", "web", route([]string{"x.example"})),
		upsert("b", "web", route([]string{"x.example"})),
		l4upsert("a", "db", store.Layer4{TCP: []store.L4Port{{Port: 5432}}}),
		l4upsert("b", "db", store.Layer4{TCP: []store.L4Port{{Port: 5432}}}),
	)
	got := reportedConflicts(v)
	want := []string{"x.example: a over b", "tcp/5432: a/db over b/db"}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("reported conflicts %q, want %q", got, want)
	}
}
