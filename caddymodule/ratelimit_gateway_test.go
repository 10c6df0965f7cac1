package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Through a real gateway: 429 with Retry-After past the limit, keys
// counted apart, the HTTPS redirect not counted, the counts published
// on the gateway's subject, and another gateway's published counts
// honoured.
func TestRateLimitThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	// A window of an hour: no test run crosses its end unnoticed (the
	// Retry-After check below would see it).
	rl := &store.RateLimit{Requests: 5, Window: store.Duration(time.Hour), Key: "header:X-Client"}
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{policyBackend(t)},
		Routes: []store.Route{
			{Hosts: []string{"plain.example"}, RedirectHTTPS: true, RateLimit: rl},
			{Hosts: []string{"shop.example"}, RateLimit: rl},
		},
	}}))
	counts := make(chan store.RateCounts, 64)
	sub, err := f.nats.Store.NC.Subscribe(f.nats.Store.Names.RateCountsSubject("gw-test"), func(m *nats.Msg) {
		var rc store.RateCounts
		if json.Unmarshal(m.Data, &rc) == nil && len(rc.Routes) > 0 {
			counts <- rc
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(host, who string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+f.gateway+"/", nil)
		req.Host = host
		req.Header.Set("X-Client", who)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i := range 5 {
		if resp, body := get("shop.example", "a"); resp.StatusCode != 200 {
			t.Fatalf("request %d of 5: %d %q", i+1, resp.StatusCode, body)
		}
	}
	resp, body := get("shop.example", "a")
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || body != "rate limit exceeded\n" || ra < 1 || ra > 3600 {
		t.Fatalf("6th request: %d %q, Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if resp, _ := get("shop.example", "b"); resp.StatusCode != 200 {
		t.Fatalf("another client: %d", resp.StatusCode)
	}
	for range 8 {
		if resp, _ := get("plain.example", "c"); resp.StatusCode != http.StatusPermanentRedirect {
			t.Fatalf("the redirect was limited: %d", resp.StatusCode)
		}
	}
	// The gateway tells the fleet what it counted: a's 5, b's 1.
	route := "shop/web/1/1h0m0s/header:X-Client"
	deadline := time.After(5 * time.Second)
	told := map[uint64]int64{}
	for told[hashKey("a")] != 5 || told[hashKey("b")] != 1 {
		select {
		case rc := <-counts:
			for _, r := range rc.Routes {
				if r.Route != route {
					t.Fatalf("counts of route %q, want %q only (redirects are not counted)", r.Route, route)
				}
				for i, k := range r.Keys {
					told[k] = r.Counts[i]
				}
			}
		case <-deadline:
			t.Fatalf("the gateway's counts were not published: %v", told)
		}
	}
	// Another gateway says client d took the whole limit: d is refused.
	b, _ := json.Marshal(store.RateCounts{Gateway: "gw-other", Routes: []store.RateRouteCounts{{Route: route,
		Window: time.Now().UnixNano() / int64(time.Hour), Keys: []uint64{hashKey("d")}, Counts: []int64{5}}}})
	if err := f.nats.Store.NC.Publish(f.nats.Store.Names.RateCountsSubject("gw-other"), b); err != nil {
		t.Fatal(err)
	}
	rates := current.Load().shared.rates
	storetest.Eventually(t, wait, "another gateway's counts heard", func() bool {
		rates.mu.Lock()
		defer rates.mu.Unlock()
		return rates.peers["gw-other"] != nil
	})
	if resp, _ := get("shop.example", "d"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("client d, at its limit at another gateway: %d", resp.StatusCode)
	}
}
