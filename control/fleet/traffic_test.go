package fleet_test

import (
	"context"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// Traffic by region: requests are served in the region of the instance's
// machine and arrive in the gateway's; those whose two regions differ
// crossed. Rates come from each gateway's last interval, and a gateway
// that restarted is not differenced against its old counters.
func TestAggregatorSumsTrafficByRegion(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.InstancesBucket()), "shop.m1.w1", record("shop", "m1", "w1", store.InstanceReady)); err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, s)
	since := time.Now().UTC().Add(-time.Minute)
	at := time.Now().UTC().Add(-2 * time.Second)
	put := func(gw, region string, at, since time.Time, n uint64, byRegion map[string]uint64) {
		t.Helper()
		c := counters("shop", "web", n, 0, 2)
		c.ByRegion = byRegion
		if err := s.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: gw, Region: region, Since: since, At: at, Services: []store.ServiceTraffic{c}}); err != nil {
			t.Fatal(err)
		}
	}
	var got map[string]store.RegionTraffic
	var fleetWide map[string]store.RegionTraffic
	arrivedIs := func(region string, n uint64) func() bool {
		return func() bool {
			sums, err := fleet.Read(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			got, fleetWide = sums["shop"].Traffic["web"].Regions, fleet.RegionTotals(sums)
			return got[region].Arrived == n
		}
	}
	// fra's gateway: 100 then 300 requests in 2 s, all served in fra;
	// tyo's gateway: 100 then 300, 80 then 200 served in tyo and the
	// rest in fra (20 then 100: 40 req/s crossed); a gateway without a
	// region: 10 then 30, all in tyo.
	put("gw-fra", "fra", at, since, 100, map[string]uint64{"fra": 100})
	put("gw-tyo", "tyo", at, since, 100, map[string]uint64{"tyo": 80, "fra": 20})
	put("gw-none", "", at, since, 10, map[string]uint64{"tyo": 10})
	storetest.Eventually(t, 10*time.Second, "the first reports by region", arrivedIs("tyo", 100))
	put("gw-fra", "fra", at.Add(2*time.Second), since, 300, map[string]uint64{"fra": 300})
	put("gw-tyo", "tyo", at.Add(2*time.Second), since, 300, map[string]uint64{"tyo": 200, "fra": 100})
	put("gw-none", "", at.Add(2*time.Second), since, 30, map[string]uint64{"tyo": 30})
	storetest.Eventually(t, 10*time.Second, "the second reports by region", arrivedIs("tyo", 300))
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	fra, tyo := got["fra"], got["tyo"]
	if fra.Served != 400 || tyo.Served != 230 || fra.Arrived != 300 || fra.Crossed != 0 || tyo.Crossed != 100 {
		t.Fatalf("counts by region: fra %+v, tyo %+v", fra, tyo)
	}
	near("fra served rate", fra.ServedRate, 100+40) // 200 from fra's gateway, 80 from tyo's, in 2 s
	near("tyo served rate", tyo.ServedRate, 60+10)  // 120 from tyo's gateway, 20 from the one without a region
	near("tyo arrived rate", tyo.ArrivedRate, 100)  // 200 in 2 s
	near("tyo crossed rate", tyo.CrossedRate, 40)   // 80 of them went to fra
	near("tyo cross share", tyo.CrossShare(), 0.4)
	near("fra cross share", fra.CrossShare(), 0)
	// What arrives at a gateway without a region arrives in region "",
	// and crosses nothing.
	if none := got[""]; none.Arrived != 30 || none.Crossed != 0 || none.Served != 0 {
		t.Errorf("the gateway without a region: %+v", none)
	}
	near("arrived rate without a region", got[""].ArrivedRate, 10)
	if fleetWide["tyo"] != tyo || fleetWide["fra"] != fra || fleetWide[""] != got[""] {
		t.Errorf("fleet-wide totals of one service: %+v, want %+v", fleetWide, got)
	}
	// The same figures as metrics, once flushed.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	wantMetrics := map[string]float64{"fra served": 140, "fra arrived": 100, "fra crossed": 0, "tyo served": 70, "tyo arrived": 100, "tyo crossed": 40,
		" served": 0, " arrived": 10, " crossed": 0}
	var gotMetrics map[string]float64
	storetest.Eventually(t, 10*time.Second, "the figures by region as metrics", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		gotMetrics = map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "edgeplane_fleet_region_requests_per_second" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				gotMetrics[labels["region"]+" "+labels["kind"]] = m.GetGauge().GetValue()
			}
		}
		return maps.Equal(gotMetrics, wantMetrics)
	})

	// tyo's gateway restarts: its counters begin again, no negative
	// interval, and its rates wait for a second report.
	put("gw-tyo", "tyo", at.Add(3*time.Second), time.Now().UTC(), 5, map[string]uint64{"tyo": 5})
	storetest.Eventually(t, 10*time.Second, "tyo's gateway's restart", arrivedIs("tyo", 5))
	if tyo := got["tyo"]; tyo.ArrivedRate != 0 || tyo.CrossedRate != 0 || tyo.Crossed != 0 || tyo.Served != 35 {
		t.Errorf("tyo after its gateway restarted: %+v", tyo)
	}
}
