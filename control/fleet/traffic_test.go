package fleet_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// counters is one service's cumulative counters at a gateway: n requests
// of which errs were 5xx, all in latency bucket bucket.
func counters(ns, svc string, n, errs uint64, bucket int) store.ServiceTraffic {
	t := store.ServiceTraffic{Namespace: ns, Service: svc, Latency: make([]uint64, len(store.TrafficLatencyBounds)+1)}
	t.Classes[1], t.Classes[4] = n-errs, errs
	t.Latency[bucket] = n
	t.BytesOut = 100 * n
	return t
}

// The aggregator sums two gateways' reports per service: totals are the
// sum of what each counted, rates are each gateway's last interval, the
// error ratio and the quantiles come from the merged interval. A report
// filed under another gateway's key is not taken in, and a gateway that
// restarted (new Since) is not differenced against its old counters.
func TestAggregatorSumsGatewayTraffic(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.InstancesBucket()), "shop.m1.w1", record("shop", "m1", "w1", store.InstanceReady)); err != nil {
		t.Fatal(err)
	}
	startAggregator(t, s)
	since := time.Now().UTC().Add(-time.Minute)
	at := time.Now().UTC().Add(-2 * time.Second)
	put := func(gw string, at time.Time, since time.Time, svcs ...store.ServiceTraffic) {
		t.Helper()
		if err := s.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: gw, Since: since, At: at, Services: svcs}); err != nil {
			t.Fatal(err)
		}
	}
	// gw1: 100 then 300 requests in 2 s (10 then 30 errors), all under
	// 5 ms; gw2: 50 then 250 in 2 s, no errors, all between 0.25 and
	// 0.5 s.
	var got store.ServiceTrafficStatus
	totalIs := func(n uint64) func() bool {
		return func() bool {
			sums, err := fleet.Read(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			got = sums["shop"].Traffic["web"]
			return got.Requests == n
		}
	}
	put("gw1", at, since, counters("shop", "web", 100, 10, 2))
	put("gw2", at, since, counters("shop", "web", 50, 0, 8))
	// The bucket keeps one report per gateway: the aggregator must see
	// these before the next ones replace them.
	storetest.Eventually(t, 10*time.Second, "the first reports summed", totalIs(150))
	if got.Rate != 0 {
		t.Errorf("a rate from one report per gateway: %+v", got)
	}
	put("gw1", at.Add(2*time.Second), since, counters("shop", "web", 300, 30, 2))
	put("gw2", at.Add(2*time.Second), since, counters("shop", "web", 250, 0, 8))
	// A forgery: gw1's key, gw3's body.
	if _, err := storetest.Bucket(t, s, s.Names.GatewayTrafficBucket()).Put(ctx, "gw1x", []byte(`{"version":1,"gateway":"gw3","services":[]}`)); err != nil {
		t.Fatal(err)
	}

	storetest.Eventually(t, 10*time.Second, "the fleet traffic of shop/web", totalIs(550))
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	if got.Errors != 30 || len(got.Gateways) != 2 {
		t.Fatalf("fleet figures: %+v", got)
	}
	near("fleet rate", got.Rate, 100+100)           // 200 and 200 more requests in 2 s each
	near("error ratio", got.ErrorRatio, 20.0/400.0) // 20 errors of the interval's 400
	// Of the interval's 400 responses, 200 are under 5 ms and 200
	// between 0.25 and 0.5 s: the median sits at the top of the first
	// half, p99 near the top of the slow bucket.
	near("p50", got.P50, 0.005)
	near("p99", got.P99, 0.25+0.25*(396.0-200.0)/200.0)
	near("gw1 rate", got.Gateways["gw1"].Rate, 100)
	near("gw2 p50", got.Gateways["gw2"].P50, 0.375)
	if _, ok := got.Gateways["gw3"]; ok {
		t.Error("a report filed under another gateway's key was taken in")
	}

	// gw2 restarts: its counters begin again; no negative interval.
	put("gw2", at.Add(3*time.Second), time.Now().UTC(), counters("shop", "web", 5, 0, 8))
	storetest.Eventually(t, 10*time.Second, "gw2's restart", totalIs(305))
	if g := got.Gateways["gw2"]; g.Rate != 0 || g.Requests != 5 {
		t.Errorf("gw2 after its restart: %+v", g)
	}

	// What a gateway sets aside reaches the namespace's summary.
	aside := store.EndpointSetAside{Namespace: "shop", Service: "web", Instance: "w1", Machine: "m1", Reason: "health check failed: no answer within 1s"}
	if err := s.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: "gw1", Since: since, At: at.Add(4 * time.Second),
		Services: []store.ServiceTraffic{counters("shop", "web", 300, 30, 2)}, SetAside: []store.EndpointSetAside{aside}}); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 10*time.Second, "gw1's set-aside endpoint in shop's summary", func() bool {
		sums, err := fleet.Read(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		l := sums["shop"].SetAside["gw1"]
		return len(l) == 1 && l[0] == aside
	})
}
