package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// canaryKey waits for the gateway to read the fleet's canary cookie key
// (the test store made it when it was provisioned) and returns it.
func (f *fixture) canaryKey() []byte {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	want, err := f.nats.Store.CanaryCookieKeyOf(ctx)
	if err != nil || want == nil {
		f.t.Fatalf("the store's canary cookie key: %+v %v", want, err)
	}
	deadline := time.Now().Add(wait)
	for {
		if a := current.Load(); a != nil && string(a.shared.canaryKey()) == string(want.Key) {
			return want.Key
		}
		if time.Now().After(deadline) {
			f.t.Fatal("the gateway did not read the canary cookie key")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stickyGet sends GET / for shop.example with the bucket cookie value
// (none if ""), and returns the backend that answered and the bucket
// cookie the gateway set, if any.
func (f *fixture) stickyGet(value string) (backend, set string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/", nil)
	req.Host = "shop.example"
	if value != "" {
		req.Header.Set("Cookie", store.StickyCookie+"="+value)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		f.t.Fatalf("GET through the split: %d", resp.StatusCode)
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == store.StickyCookie {
			set = ck.Value
		}
	}
	return resp.Header.Get("X-Backend"), set
}

// canarySides reads the gateway's canary counters of shop/web: the
// requests counted on each side.
func canarySides(t *testing.T) (old, fresh uint64) {
	t.Helper()
	for _, s := range current.Load().shared.traffic.snapshot(0) {
		if s.Namespace == "shop" && s.Service == "web" && s.Canary != nil {
			for i := range s.Canary.Old.Classes {
				old += s.Canary.Old.Classes[i]
				fresh += s.Canary.New.Classes[i]
			}
		}
	}
	return old, fresh
}

// The bucket cookie carries a MAC under the fleet's key: a valid one
// keeps its client on its side and is not set again; an unsigned,
// forged, tampered or other canary's cookie is no cookie (the client is
// split by the weight as a new one and gets a signed cookie); a flood of
// them moves no request to the side they name. One client's requests on
// the side its cookie holds count at most canaryClientRate a second.
func TestStickyBucketCookieIsSigned(t *testing.T) {
	f := newFixture(t)
	f.load()
	a, b := newBackend(t, "old-a"), newBackend(t, "old-b")
	c, d := newBackend(t, "new-c"), newBackend(t, "new-d")
	isNew := func(name string) bool { return name == "new-c" || name == "new-d" }
	key := f.canaryKey()
	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 10, Sticky: true}, []*backend{a, b}, []*backend{c, d})

	// A valid cookie sticks, on either side, and is not set again.
	for _, bucket := range []int{0, 999, 1000, 9999} {
		for range 5 {
			got, set := f.stickyGet(store.SignCanaryBucket(key, "d2", bucket))
			if isNew(got) != (bucket < 1000) || set != "" {
				t.Fatalf("bucket %d at 10%%: answered by %s, cookie set %q", bucket, got, set)
			}
		}
	}
	// Everything else is no cookie: split as new clients, each given a
	// signed cookie of the side it was sent to.
	valid := store.SignCanaryBucket(key, "d2", 9999)
	_, mac, _ := strings.Cut(valid, ".")
	otherKey := append([]byte(nil), key...)
	otherKey[0] ^= 1
	bad := map[string]string{
		"unsigned":            "0",
		"forged":              "0.AAAAAAAAAAAAAAAAAAAAAA",
		"tampered":            "0." + mac,
		"another canary's":    store.SignCanaryBucket(key, "d1", 0),
		"another fleet's key": store.SignCanaryBucket(otherKey, "d2", 0),
		"out of range":        store.SignCanaryBucket(key, "d2", store.CanaryBuckets),
		"leading zero":        "00." + strings.SplitN(store.SignCanaryBucket(key, "d2", 0), ".", 2)[1],
		"empty mac":           "0.",
	}
	for name, v := range bad {
		oldBefore, newBefore := canarySides(t)
		const n = 200
		onNew := 0
		for range n {
			got, set := f.stickyGet(v)
			bucket, ok := store.CanaryBucketOf(key, "d2", set)
			if !ok || isNew(got) != (bucket < 1000) {
				t.Fatalf("%s cookie %q: answered by %s, cookie set %q (valid %v)", name, v, got, set, ok)
			}
			if isNew(got) {
				onNew++
			}
		}
		oldAfter, newAfter := canarySides(t)
		// Split as new clients are: exactly the weight (the counter
		// sends 10 of every 100), and counted as such.
		if onNew != n/10 || newAfter-newBefore != uint64(onNew) || oldAfter-oldBefore != uint64(n-onNew) {
			t.Fatalf("%s cookies: %d of %d to the new revision, counted new +%d old +%d; want %d as for new clients",
				name, onNew, n, newAfter-newBefore, oldAfter-oldBefore, n/10)
		}
	}

	// One client repeating a valid new-side cookie counts at most
	// canaryClientRate a second in the canary's figures.
	_, newBefore := canarySides(t)
	start := time.Now()
	const flood = 1000
	for range flood {
		if got, _ := f.stickyGet(store.SignCanaryBucket(key, "d2", 0)); !isNew(got) {
			t.Fatalf("a valid bucket 0 cookie was answered by %s", got)
		}
	}
	secs := uint64(time.Since(start)/time.Second) + 2
	_, newAfter := canarySides(t)
	counted := newAfter - newBefore
	t.Logf("%d requests of one client with a new-side cookie in %s: %d counted (cap %d/s)", flood, time.Since(start).Round(time.Millisecond), counted, canaryClientRate)
	if counted > canaryClientRate*secs || counted == 0 {
		t.Fatalf("one client's %d cookie-routed requests over < %d s counted %d times; want 1..%d", flood, secs, counted, canaryClientRate*secs)
	}
}
