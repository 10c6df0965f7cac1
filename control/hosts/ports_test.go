package hosts_test

import (
	"context"
	"slices"
	"testing"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

var (
	pg  = store.PortKey{Proto: store.ProtoTCP, Port: 5432}
	dns = store.PortKey{Proto: store.ProtoUDP, Port: 53}
)

func ownedPorts(t *testing.T, s *store.Store, ns string) []string {
	t.Helper()
	ps, err := hosts.OwnedPorts(context.Background(), s, ns)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.Key.String()+"="+p.Service)
	}
	return out
}

// A gateway port belongs to one namespace: another's claim is refused
// with port_owned naming the port, its owner and the owner's service, and
// writes nothing (nor the hosts asked with it); the owner may move it
// between its services; once released it is free.
func TestPortOwnership(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	claimed, err := hosts.Claim(ctx, s, "prod", "d1", hosts.Wanted{Hosts: []string{"db.example.com"}, Ports: []hosts.Port{{pg, "db"}, {dns, "dns"}}})
	if err != nil || len(claimed.Ports) != 2 || len(claimed.Hosts) != 1 {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	if got := ownedPorts(t, s, "prod"); !slices.Equal(got, []string{"tcp/5432=db", "udp/53=dns"}) {
		t.Fatalf("prod owns %v", got)
	}
	// Another service of prod takes tcp/5432: prod's already, so nothing
	// newly claimed, but the claim names the new service.
	if claimed, err := hosts.Claim(ctx, s, "prod", "d2", hosts.Wanted{Ports: []hosts.Port{{pg, "replica"}}}); err != nil || !claimed.Empty() {
		t.Fatalf("move: %+v %v", claimed, err)
	}
	if got := ownedPorts(t, s, "prod"); !slices.Equal(got, []string{"tcp/5432=replica", "udp/53=dns"}) {
		t.Fatalf("prod owns %v after the move", got)
	}
	want := hosts.Wanted{Hosts: []string{"free.example.org"}, Ports: []hosts.Port{{store.PortKey{Proto: "tcp", Port: 6379}, "cache"}, {pg, "pg"}}}
	for _, call := range []func() error{
		func() error { return hosts.Check(ctx, s, "test", want) },
		func() error { _, err := hosts.Claim(ctx, s, "test", "d3", want); return err },
	} {
		se := store.AsError(call())
		if se == nil || se.Code != store.CodePortOwned || se.Detail["port"] != "tcp/5432" || se.Detail["owner"] != "prod" ||
			se.Detail["owner_service"] != "replica" || se.Detail["requester"] != "test" || se.Detail["service"] != "pg" ||
			se.Message != "port tcp/5432 belongs to namespace prod (service replica); namespace test may not expose it" {
			t.Fatalf("got %v (%+v), want port_owned by prod", se, se)
		}
	}
	if got := ownedPorts(t, s, "test"); len(got) != 0 {
		t.Fatalf("a refused claim wrote ports %v", got)
	}
	if hs, _ := hosts.Owned(ctx, s, "test"); len(hs) != 0 {
		t.Fatalf("a refused claim wrote hosts %v", hs)
	}
	// The same number over the other protocol is another port.
	if _, err := hosts.Claim(ctx, s, "test", "d4", hosts.Wanted{Ports: []hosts.Port{{store.PortKey{Proto: "udp", Port: 5432}, "pg"}}}); err != nil {
		t.Fatal(err)
	}
	// Releasing someone else's port does nothing.
	if err := hosts.Release(ctx, s, "test", hosts.Wanted{Ports: []hosts.Port{{pg, "pg"}}}); err != nil {
		t.Fatal(err)
	}
	if got := ownedPorts(t, s, "prod"); len(got) != 2 {
		t.Fatalf("prod owns %v after test released its port", got)
	}
	// prod stops exposing tcp/5432 (keeps its host and udp/53): free for test.
	if err := hosts.KeepOnly(ctx, s, "prod", hosts.Wanted{Hosts: []string{"db.example.com"}, Ports: []hosts.Port{{dns, "dns"}}}); err != nil {
		t.Fatal(err)
	}
	if got := ownedPorts(t, s, "prod"); !slices.Equal(got, []string{"udp/53=dns"}) {
		t.Fatalf("prod owns %v after KeepOnly", got)
	}
	if hs, _ := hosts.Owned(ctx, s, "prod"); !slices.Equal(hs, []string{"db.example.com"}) {
		t.Fatalf("prod's hosts %v after KeepOnly", hs)
	}
	if _, err := hosts.Claim(ctx, s, "test", "d5", want); err != nil {
		t.Fatal(err)
	}
	if got := ownedPorts(t, s, "test"); !slices.Equal(got, []string{"tcp/5432=pg", "tcp/6379=cache", "udp/5432=pg"}) {
		t.Fatalf("test owns %v", got)
	}
	// An apply that gives back what it claimed leaves what was owned before.
	if err := hosts.Release(ctx, s, "test", hosts.Wanted{Ports: []hosts.Port{{pg, "pg"}}}); err != nil {
		t.Fatal(err)
	}
	if got := ownedPorts(t, s, "test"); !slices.Equal(got, []string{"tcp/6379=cache", "udp/5432=pg"}) {
		t.Fatalf("test owns %v after the release", got)
	}
}

// A passthrough host is a host: it conflicts with another namespace's
// HTTP host (and wildcard) and they with it.
func TestPassthroughHostsAreHosts(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	web := &store.Manifest{Namespace: "web", Services: map[string]store.ServiceSpec{
		"www": {Routes: []store.Route{{Hosts: []string{"www.example.com", "*.shop.example.com"}}}},
	}}
	db := &store.Manifest{Namespace: "data", Services: map[string]store.ServiceSpec{
		"pg": {Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}}, TLSPassthrough: &store.Passthrough{Hosts: []string{"db.example.com"}}}},
	}}
	if _, err := hosts.Claim(ctx, s, "web", "d1", hosts.Of(web)); err != nil {
		t.Fatal(err)
	}
	if _, err := hosts.Claim(ctx, s, "data", "d2", hosts.Of(db)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns, host, code string
	}{
		{"data", "www.example.com", store.CodeHostOwned},    // passthrough over web's HTTP host
		{"data", "a.shop.example.com", store.CodeHostOwned}, // under web's wildcard
		{"web", "db.example.com", store.CodeHostOwned},      // HTTP over data's passthrough host
	} {
		m := &store.Manifest{Namespace: c.ns, Services: map[string]store.ServiceSpec{
			"x": {Layer4: store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{c.host}}}},
		}}
		if c.ns == "web" {
			m.Services["x"] = store.ServiceSpec{Routes: []store.Route{{Hosts: []string{c.host}}}}
		}
		if se := store.AsError(hosts.Check(ctx, s, c.ns, hosts.Of(m))); se == nil || se.Code != c.code || se.Detail["host"] != c.host {
			t.Errorf("%s asking %s: %v, want %s", c.ns, c.host, se, c.code)
		}
	}
}

func TestPortsOfManifestListsEachPortOnce(t *testing.T) {
	m := &store.Manifest{Services: map[string]store.ServiceSpec{
		"b":   {Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}}, UDP: []store.L4Port{{Port: 53}}}},
		"a":   {Layer4: store.Layer4{TCP: []store.L4Port{{Port: 5432}, {Port: 22}}}},
		"web": {Routes: []store.Route{{Hosts: []string{"b.example.com"}}}, Layer4: store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{"a.example.com"}}}},
	}}
	var got []string
	for _, p := range hosts.PortsOfManifest(m) {
		got = append(got, p.Key.String()+"="+p.Service)
	}
	if want := []string{"tcp/22=a", "tcp/5432=a", "udp/53=b"}; !slices.Equal(got, want) {
		t.Fatalf("PortsOfManifest = %v, want %v", got, want)
	}
	if got, want := hosts.OfManifest(m), []string{"a.example.com", "b.example.com"}; !slices.Equal(got, want) {
		t.Fatalf("OfManifest = %v, want %v", got, want)
	}
}
