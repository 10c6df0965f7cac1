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

// Layer-4 connections are summed as requests are: counts and open
// connections over the gateways reporting now, rates from each gateway's
// last interval; a service reached only below HTTP (no latency histogram)
// is counted by its connections; the figures are exported as metrics; a
// gateway that restarted is not differenced against its old counters.
func TestAggregatorSumsLayer4Traffic(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.InstancesBucket()), "shop.m1.w1", record("shop", "m1", "w1", store.InstanceReady)); err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, s)
	since := time.Now().UTC().Add(-time.Minute)
	at := time.Now().UTC().Add(-2 * time.Second)
	// db: layer 4 only, no histogram; web: HTTP and layer 4.
	put := func(gw string, at, since time.Time, db, web store.L4Traffic) {
		t.Helper()
		w := counters("shop", "web", 10, 0, 2)
		w.L4 = &web
		svcs := []store.ServiceTraffic{{Namespace: "shop", Service: "db", L4: &db}, w}
		if err := s.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: gw, Since: since, At: at, Services: svcs}); err != nil {
			t.Fatal(err)
		}
	}
	var db, web store.ServiceTrafficStatus
	totalIs := func(n uint64) func() bool {
		return func() bool {
			sums, err := fleet.Read(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			db, web = sums["shop"].Traffic["db"], sums["shop"].Traffic["web"]
			return db.L4 != nil && db.L4.Total == n
		}
	}
	put("gw1", at, since, store.L4Traffic{Open: 3, Total: 100, BytesIn: 1000, BytesOut: 5000, ConnectErrors: 2}, store.L4Traffic{Total: 1})
	put("gw2", at, since, store.L4Traffic{Open: 1, Total: 50, BytesIn: 500, BytesOut: 2000, Refused: 1}, store.L4Traffic{})
	storetest.Eventually(t, 10*time.Second, "the first layer-4 reports summed", totalIs(150))
	if db.L4.Rate != 0 || db.L4.Open != 4 || db.Requests != 0 {
		t.Errorf("db from one report per gateway: %+v %+v", db.TrafficFigures, *db.L4)
	}
	put("gw1", at.Add(2*time.Second), since, store.L4Traffic{Open: 5, Total: 300, BytesIn: 3000, BytesOut: 9000, ConnectErrors: 6}, store.L4Traffic{Total: 11})
	put("gw2", at.Add(2*time.Second), since, store.L4Traffic{Open: 2, Total: 150, BytesIn: 1500, BytesOut: 4000, Refused: 5}, store.L4Traffic{})
	storetest.Eventually(t, 10*time.Second, "the second layer-4 reports summed", totalIs(450))
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	f := *db.L4
	if f.Open != 7 || f.BytesIn != 4500 || f.BytesOut != 13000 || f.ConnectErrors != 6 || f.Refused != 5 {
		t.Fatalf("db's fleet counts: %+v", f)
	}
	near("db connection rate", f.Rate, 100+50)        // 200 and 100 more in 2 s
	near("db bytes in rate", f.BytesInRate, 1000+500) // 2000 and 1000 more in 2 s
	near("db bytes out rate", f.BytesOutRate, 2000+1000)
	near("db connect error rate", f.ConnectErrorRate, 2)
	near("db refused rate", f.RefusedRate, 2)
	if g := db.Gateways["gw1"].L4; g == nil || g.Total != 300 || g.Open != 5 {
		t.Fatalf("db at gw1: %+v", g)
	} else {
		near("db rate at gw1", g.Rate, 100)
	}
	if db.Requests != 0 || db.Rate != 0 {
		t.Errorf("db has no requests: %+v", db.TrafficFigures)
	}
	// web keeps its request figures beside its connections.
	if web.Requests != 20 || web.L4 == nil || web.L4.Total != 11 {
		t.Fatalf("web: %+v l4 %+v", web.TrafficFigures, web.L4)
	}
	near("web connection rate", web.L4.Rate, 5)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	want := map[string]float64{
		"edgeplane_fleet_service_l4_connections_open db":        7,
		"edgeplane_fleet_service_l4_connections_per_second db":  150,
		"edgeplane_fleet_service_l4_bytes_per_second db in":     1500,
		"edgeplane_fleet_service_l4_bytes_per_second db out":    3000,
		"edgeplane_fleet_service_l4_connect_errors db connect":  6,
		"edgeplane_fleet_service_l4_connect_errors db refused":  5,
		"edgeplane_fleet_service_l4_connections_per_second web": 5,
	}
	var got map[string]float64
	storetest.Eventually(t, 10*time.Second, "the layer-4 figures as metrics", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				key := mf.GetName() + " " + labels["service"]
				for _, extra := range []string{"direction", "kind"} {
					if v := labels[extra]; v != "" {
						key += " " + v
					}
				}
				if _, ok := want[key]; ok {
					got[key] = m.GetGauge().GetValue()
				}
			}
		}
		return maps.EqualFunc(got, want, func(a, b float64) bool { return math.Abs(a-b) < 1e-6 })
	})

	// gw2 restarts: its counts begin again and its rates wait for its
	// next report.
	put("gw2", at.Add(3*time.Second), time.Now().UTC(), store.L4Traffic{Open: 1, Total: 4}, store.L4Traffic{})
	storetest.Eventually(t, 10*time.Second, "gw2's restart", totalIs(304))
	if g := db.Gateways["gw2"].L4; g == nil || g.Rate != 0 || g.Total != 4 {
		t.Errorf("db at gw2 after its restart: %+v", g)
	}
	near("db connection rate after gw2's restart", db.L4.Rate, 100)
}
