package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestHostKeyKeepsEverythingUnderANameUnderOnePrefix(t *testing.T) {
	for host, want := range map[string]string{
		"api.example.com":   "com.example.api",
		"*.example.com":     "com.example._",
		"a.b.example.com":   "com.example.b.a",
		"xn--bcher-kva.com": "com.xn--bcher-kva",
	} {
		if got := store.HostKey(host); got != want {
			t.Errorf("HostKey(%q) = %q, want %q", host, got, want)
		}
	}
}

// One namespace owns a host; a covering wildcard conflicts both ways; the
// owner may move it between its services; a released host is free.
func TestHostOwnership(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	owned := func(ns string) []string {
		t.Helper()
		hs, err := s.OwnedHosts(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}
	claimed, err := s.ClaimHosts(ctx, "prod", "d1", []string{"api.example.com", "*.shop.example.com"})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	// Claiming again what it owns claims nothing new.
	if claimed, err := s.ClaimHosts(ctx, "prod", "d2", []string{"api.example.com"}); err != nil || len(claimed) != 0 {
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
			func() error { return s.CheckHosts(ctx, "test", []string{"free.example.org", r.host}) },
			func() error {
				_, err := s.ClaimHosts(ctx, "test", "d3", []string{"free.example.org", r.host})
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
	if err := s.CheckHosts(ctx, "test", []string{"example.com", "other.example.com"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckHosts(ctx, "prod", []string{"api.example.com", "y.shop.example.com"}); err != nil {
		t.Fatal(err)
	}
	// prod stops routing the wildcard: it is free for test.
	if err := s.KeepOnlyHosts(ctx, "prod", []string{"api.example.com"}); err != nil {
		t.Fatal(err)
	}
	if hs := owned("prod"); !slices.Equal(hs, []string{"api.example.com"}) {
		t.Fatalf("prod owns %v", hs)
	}
	if _, err := s.ClaimHosts(ctx, "test", "d4", []string{"x.shop.example.com"}); err != nil {
		t.Fatal(err)
	}
	// Releasing someone else's host does nothing.
	if err := s.ReleaseHosts(ctx, "test", []string{"api.example.com"}); err != nil {
		t.Fatal(err)
	}
	if hs := owned("prod"); !slices.Equal(hs, []string{"api.example.com"}) {
		t.Fatalf("prod owns %v after test released its host", hs)
	}
}
