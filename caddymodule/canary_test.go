package caddymodule

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// publishSplit publishes web.shop routed to old (revision 1) and fresh
// (revision 2) split by sp, and waits for the gateway to apply it.
func (f *fixture) publishSplit(sp *store.Split, old, fresh []*backend) {
	f.t.Helper()
	ev := store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web", DeployID: "d2", Revision: 2,
		Routes: []store.Route{{Hosts: []string{"shop.example"}}}, Split: sp, At: time.Now().UTC()}
	for i, b := range old {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: b.name, Machine: "m1", Slot: i, Revision: 1, Address: b.host, Port: b.port})
	}
	for i, b := range fresh {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: b.name, Machine: "m1", Slot: i, Revision: 2, Address: b.host, Port: b.port})
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// The backends listen on loopback, where m1 is admitted.
	if _, err := storetest.AdmitMachine(ctx, f.nats.Store, "m1", "127.0.0.1"); err != nil {
		f.t.Fatal(err)
	}
	seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{ev})
	if err != nil {
		f.t.Fatal(err)
	}
	f.waitSeq(seq)
}

// getWith sends GET / for shop.example through the gateway with client
// and header, and returns the backend that answered.
func (f *fixture) getWith(client *http.Client, header http.Header) string {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/", nil)
	req.Host = "shop.example"
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		f.t.Fatalf("GET through the split: %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Backend")
}

// A split service sends exactly its weight to the new revision over
// 10,000 requests, counts each side apart, keeps a client with its bucket
// cookie on one side (moving it only towards the new revision as the
// weight rises), sends the match header to the new side, and a side whose
// endpoints all fail their checks leaves its requests to the other.
func TestSplitWeightsStickinessAndMatch(t *testing.T) {
	f := newFixture(t)
	f.load()
	a, b := newBackend(t, "old-a"), newBackend(t, "old-b")
	c, d := newBackend(t, "new-c"), newBackend(t, "new-d")
	isNew := func(name string) bool { return name == "new-c" || name == "new-d" }

	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 10}, []*backend{a, b}, []*backend{c, d})
	const n = 10000
	fresh := 0
	for range n {
		if isNew(f.getWith(f.client, nil)) {
			fresh++
		}
	}
	share := 100 * float64(fresh) / n
	t.Logf("weight 10%%: %d of %d requests to the new revision (%.2f%%)", fresh, n, share)
	if share < 8.5 || share > 11.5 {
		t.Fatalf("weight 10%%: %.2f%% went to the new revision", share)
	}
	var got *store.CanaryTraffic
	for _, s := range current.Load().shared.traffic.snapshot(0) {
		if s.Namespace == "shop" && s.Service == "web" {
			got = s.Canary
		}
	}
	if got == nil || got.Deploy != "d2" || got.New.Revision != 2 || got.Old.Revision != 1 ||
		got.New.Classes[1] != uint64(fresh) || got.Old.Classes[1] != uint64(n-fresh) {
		t.Fatalf("canary counters: %+v", got)
	}

	// Sticky at 30%: each client keeps its side; raising the weight to 60
	// keeps every client already on the new side there.
	key := f.canaryKey()
	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 30, Sticky: true}, []*backend{a, b}, []*backend{c, d})
	type client struct {
		c     *http.Client
		isNew bool
	}
	var clients []client
	onNew := 0
	for range 100 {
		jar, _ := cookiejar.New(nil)
		cl := client{c: &http.Client{Jar: jar, Timeout: 5 * time.Second}}
		cl.isNew = isNew(f.getWith(cl.c, nil))
		for range 5 {
			if isNew(f.getWith(cl.c, nil)) != cl.isNew {
				t.Fatal("a client with its cookie changed sides")
			}
		}
		if cl.isNew {
			onNew++
		}
		clients = append(clients, cl)
	}
	if onNew != 30 {
		t.Errorf("100 new sticky clients at 30%%: %d on the new side", onNew)
	}
	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 60, Sticky: true}, []*backend{a, b}, []*backend{c, d})
	moved := 0
	for _, cl := range clients {
		now := isNew(f.getWith(cl.c, nil))
		if cl.isNew && !now {
			t.Fatal("raising the weight moved a client back to the old revision")
		}
		if now && !cl.isNew {
			moved++
		}
	}
	t.Logf("sticky: 30 of 100 clients on the new revision at 30%%; raising to 60%% moved %d more, none back", moved)
	// A bucket out of range is no bucket: the client gets a new one.
	for _, v := range []string{"-1", "10000", "x"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/", nil)
		req.Host = "shop.example"
		req.Header.Set("Cookie", store.StickyCookie+"="+v)
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		ok := false
		for _, ck := range resp.Cookies() {
			if ck.Name == store.StickyCookie {
				_, ok = store.CanaryBucketOf(key, "d2", ck.Value)
			}
		}
		if resp.StatusCode != 200 || !ok || len(resp.Cookies()) != 1 {
			t.Errorf("bucket %q: %d, cookies %v", v, resp.StatusCode, resp.Cookies())
		}
	}
	if isNew(f.getWith(f.client, http.Header{"Cookie": {store.StickyCookie + "=" + store.SignCanaryBucket(key, "d2", 9999)}})) {
		t.Error("bucket 9999 at 60% went to the new revision")
	}
	if !isNew(f.getWith(f.client, http.Header{"Cookie": {store.StickyCookie + "=" + store.SignCanaryBucket(key, "d2", 0)}})) {
		t.Error("bucket 0 at 60% went to the old revision")
	}

	// Testers by header, at weight 0.
	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 0, Match: &store.CanaryMatch{Header: "X-Canary", Value: "yes"}},
		[]*backend{a, b}, []*backend{c, d})
	for range 50 {
		if isNew(f.getWith(f.client, nil)) {
			t.Fatal("weight 0 sent a request to the new revision")
		}
		if !isNew(f.getWith(f.client, http.Header{"X-Canary": {"yes"}})) {
			t.Fatal("the match header did not reach the new revision")
		}
		if isNew(f.getWith(f.client, http.Header{"X-Canary": {"no"}})) {
			t.Fatal("another header value reached the new revision")
		}
	}
	// Testers by cookie.
	f.publishSplit(&store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 0, Match: &store.CanaryMatch{Cookie: "tester", Value: "1"}},
		[]*backend{a, b}, []*backend{c, d})
	for range 20 {
		if !isNew(f.getWith(f.client, http.Header{"Cookie": {"tester=1"}})) {
			t.Fatal("the match cookie did not reach the new revision")
		}
		if isNew(f.getWith(f.client, http.Header{"Cookie": {"tester=2"}})) {
			t.Fatal("another cookie value reached the new revision")
		}
	}
}
