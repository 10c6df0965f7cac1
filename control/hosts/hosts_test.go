package hosts_test

import (
	"context"
	"slices"
	"testing"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// One namespace owns a host; a covering wildcard conflicts both ways; the
// owner may move it between its services; a released host is free.
func TestHostOwnership(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	owned := func(ns string) []string {
		t.Helper()
		hs, err := hosts.Owned(ctx, s, ns)
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	claimed, err := hosts.Claim(ctx, s, "prod", "d1", hosts.Wanted{Hosts: []string{"api.example.com", "*.shop.example.com"}})
	if err != nil || len(claimed.Hosts) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	// Claiming again what it owns claims nothing new.
	if claimed, err := hosts.Claim(ctx, s, "prod", "d2", hosts.Wanted{Hosts: []string{"api.example.com"}}); err != nil || !claimed.Empty() {
		t.Fatalf("reclaim: %v %v", claimed, err)
	}
	refused := []struct{ host, owned string }{
		{"api.example.com", "api.example.com"},
		{"*.example.com", "*.shop.example.com"},      // covers both of prod's hosts; the first is named
		{"x.shop.example.com", "*.shop.example.com"}, // covered by prod's wildcard
		{"*.a.shop.example.com", "*.shop.example.com"},
		{"*.com", "*.shop.example.com"},
	}
	for _, r := range refused {
		for _, call := range []func() error{
			func() error {
				return hosts.Check(ctx, s, "test", hosts.Wanted{Hosts: []string{"free.example.org", r.host}})
			},
			func() error {
				_, err := hosts.Claim(ctx, s, "test", "d3", hosts.Wanted{Hosts: []string{"free.example.org", r.host}})
				return err
			},
		} {
			se := store.AsError(call())
			if se == nil || se.Code != store.CodeHostOwned || se.Detail["host"] != r.host || se.Detail["owner"] != "prod" ||
				se.Detail["requester"] != "test" || se.Detail["owned_host"] != r.owned {
				t.Fatalf("%s: got %v (%+v), want host_owned by prod through %s", r.host, se, se, r.owned)
			}
		}
	}
	if hs := owned("test"); len(hs) != 0 {
		t.Fatalf("a refused claim wrote %v", hs)
	}
	// Another namespace's unrelated hosts are fine, and the owner itself
	// may route what it owns from any service.
	if err := hosts.Check(ctx, s, "test", hosts.Wanted{Hosts: []string{"example.com", "other.example.com"}}); err != nil {
		t.Fatal(err)
	}
	if err := hosts.Check(ctx, s, "prod", hosts.Wanted{Hosts: []string{"api.example.com", "y.shop.example.com"}}); err != nil {
		t.Fatal(err)
	}
	// prod stops routing the wildcard: it is free for test.
	if err := hosts.KeepOnly(ctx, s, "prod", hosts.Wanted{Hosts: []string{"api.example.com"}}); err != nil {
		t.Fatal(err)
	}
	if hs := owned("prod"); !slices.Equal(hs, []string{"api.example.com"}) {
		t.Fatalf("prod owns %v", hs)
	}
	if _, err := hosts.Claim(ctx, s, "test", "d4", hosts.Wanted{Hosts: []string{"x.shop.example.com"}}); err != nil {
		t.Fatal(err)
	}
	// Releasing someone else's host does nothing.
	if err := hosts.Release(ctx, s, "test", hosts.Wanted{Hosts: []string{"api.example.com"}}); err != nil {
		t.Fatal(err)
	}
	if hs := owned("prod"); !slices.Equal(hs, []string{"api.example.com"}) {
		t.Fatalf("prod owns %v after test released its host", hs)
	}
}

func TestOfManifestListsEachHostOnce(t *testing.T) {
	m := &store.Manifest{Services: map[string]store.ServiceSpec{
		"web": {Routes: []store.Route{{Hosts: []string{"b.example.com", "a.example.com"}}}},
		"api": {Routes: []store.Route{{Hosts: []string{"a.example.com"}, PathPrefixes: []string{"/api"}}, {Hosts: []string{"*.example.com"}}}},
		"job": {},
	}}
	if got, want := hosts.OfManifest(m), []string{"*.example.com", "a.example.com", "b.example.com"}; !slices.Equal(got, want) {
		t.Fatalf("OfManifest = %v, want %v", got, want)
	}
}
