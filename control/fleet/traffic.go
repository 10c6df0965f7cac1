package fleet

import (
	"cmp"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/store"
)

// Fleet traffic. Each gateway reports its per-service counters, cumulative
// since it started, every few seconds (store.GatewayTraffic). The
// aggregator keeps each gateway's last two reports: their difference is
// the gateway's traffic over its last interval (rates, error ratio, the
// latency histogram of that interval), and their sum over gateways is the
// fleet's. Quantiles come from the merged histograms, never from averaging
// the gateways' quantiles. A gateway whose report stops coming is dropped
// once its report is older than the bucket's TTL.
//
// By region: a request is served in the region of the instance's machine
// (the gateway counts them per region, ServiceTraffic.ByRegion) and
// arrives in the gateway's region; it crossed when the two differ. A
// gateway without a region (its requests arrive in region "") crosses
// nothing: it has no home to leave.

// byService is one namespace's counters in a report, by service.
type byService map[string]store.ServiceTraffic

// gatewayReports are one gateway's last two reports, indexed by
// namespace so that a namespace's summary costs its own services.
type gatewayReports struct {
	// region is the gateway's own ("" for none).
	region     string
	since      time.Time
	at, prevAt time.Time
	cur, prev  map[string]byService
	// aside are the endpoints the gateway sets aside, by namespace.
	aside map[string][]store.EndpointSetAside
}

// touchAll marks dirty every namespace g names; a.mu is held.
func (a *Aggregator) touchAll(g *gatewayReports, now time.Time) {
	for ns := range g.cur {
		a.touch(ns, now)
	}
	for ns := range g.aside {
		a.touch(ns, now)
	}
}

// trafficReport takes in a gateway's report; a.mu is not held.
func (a *Aggregator) trafficReport(ent jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	key := ent.Key()
	old := a.traffic[key]
	var rep store.GatewayTraffic
	if ent.Operation() != jetstream.KeyValuePut || store.DecodeKeyed(a.s.Names.GatewayTrafficBucket(), key, ent.Value(), &rep) != nil {
		a.dropGateway(key, now)
		return
	}
	g := &gatewayReports{region: rep.Region, since: rep.Since, at: rep.At, cur: map[string]byService{}, aside: map[string][]store.EndpointSetAside{}}
	for _, s := range rep.Services {
		if len(s.Latency) != len(store.TrafficLatencyBounds)+1 {
			if s.L4 == nil {
				continue // another histogram layout: not comparable
			}
			s = l4Only(s)
		}
		if g.cur[s.Namespace] == nil {
			g.cur[s.Namespace] = byService{}
		}
		g.cur[s.Namespace][s.Service] = s
	}
	for _, sa := range rep.SetAside {
		g.aside[sa.Namespace] = append(g.aside[sa.Namespace], sa)
	}
	// The previous report is the baseline only while the counters are
	// the same ones (the gateway did not restart) and it is older.
	if old != nil && old.since.Equal(rep.Since) && old.at.Before(rep.At) {
		g.prev, g.prevAt = old.cur, old.at
	}
	if old != nil {
		a.touchAll(old, now)
	}
	a.touchAll(g, now)
	a.traffic[key] = g
}

// dropGateway forgets a gateway's reports; a.mu is held.
func (a *Aggregator) dropGateway(key string, now time.Time) {
	if g := a.traffic[key]; g != nil {
		a.touchAll(g, now)
		delete(a.traffic, key)
	}
}

// ageTraffic drops gateways whose last report aged out of the bucket;
// a.mu is not held.
func (a *Aggregator) ageTraffic() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for key, g := range a.traffic {
		if now.Sub(g.at) > store.GatewayObservationTTL {
			a.dropGateway(key, now)
		}
	}
}

// interval is one gateway's traffic to one service over its last interval.
type interval struct {
	total, errors, bytesIn, bytesOut uint64
	latency                          []uint64
	window                           time.Duration
}

// sinceLast returns cur minus prev (counters that went backwards count as
// restarted from zero).
func sinceLast(cur, prev store.ServiceTraffic, window time.Duration) interval {
	d := func(c, p uint64) uint64 {
		if c < p {
			return c
		}
		return c - p
	}
	iv := interval{total: d(cur.Requests(), prev.Requests()), errors: d(cur.Classes[4], prev.Classes[4]),
		bytesIn: d(cur.BytesIn, prev.BytesIn), bytesOut: d(cur.BytesOut, prev.BytesOut),
		latency: make([]uint64, len(cur.Latency)), window: window}
	for i := range cur.Latency {
		var p uint64
		if i < len(prev.Latency) {
			p = prev.Latency[i]
		}
		iv.latency[i] = d(cur.Latency[i], p)
	}
	return iv
}

// figures turns counters and an interval into figures.
func figures(requests, errors uint64, open int64, iv interval) store.TrafficFigures {
	f := store.TrafficFigures{Requests: requests, Errors: errors, Open: open, Window: store.Duration(iv.window)}
	if iv.window > 0 {
		secs := iv.window.Seconds()
		f.Rate = float64(iv.total) / secs
		f.BytesInRate, f.BytesOutRate = float64(iv.bytesIn)/secs, float64(iv.bytesOut)/secs
	}
	if iv.total > 0 {
		f.ErrorRatio = float64(iv.errors) / float64(iv.total)
		f.P50 = store.LatencyQuantile(0.50, iv.latency)
		f.P99 = store.LatencyQuantile(0.99, iv.latency)
	}
	return f
}

// maxGatewaysListed bounds the per-gateway figures one service's summary
// carries: the busiest are listed, the fleet figures count them all.
const maxGatewaysListed = 32

// trafficOf computes ns's traffic per service; a.mu is held.
func (a *Aggregator) trafficOf(ns string) map[string]store.ServiceTrafficStatus {
	type acc struct {
		requests, errors uint64
		open             int64
		sum              interval
		gateways         map[string]store.TrafficFigures
		regions          map[string]store.RegionTraffic
		l4               *store.L4Figures
	}
	services := map[string]*acc{}
	for gw, g := range a.traffic {
		for svc, cur := range g.cur[ns] {
			s := services[svc]
			if s == nil {
				s = &acc{gateways: map[string]store.TrafficFigures{}, sum: interval{latency: make([]uint64, len(cur.Latency))}}
				services[svc] = s
			}
			var iv interval
			if prev, ok := g.prev[ns][svc]; ok {
				iv = sinceLast(cur, prev, g.at.Sub(g.prevAt))
			} else if g.prev != nil {
				// New since the last report: all of it is this interval's.
				iv = sinceLast(cur, store.ServiceTraffic{}, g.at.Sub(g.prevAt))
			}
			s.requests += cur.Requests()
			s.errors += cur.Classes[4]
			s.open += cur.Open
			s.sum.total += iv.total
			s.sum.errors += iv.errors
			s.sum.bytesIn += iv.bytesIn
			s.sum.bytesOut += iv.bytesOut
			for i := range iv.latency {
				s.sum.latency[i] += iv.latency[i]
			}
			s.sum.window = max(s.sum.window, iv.window)
			gf := figures(cur.Requests(), cur.Classes[4], cur.Open, iv)
			if cur.L4 != nil {
				var prevL4 *store.L4Traffic
				if p, ok := g.prev[ns][svc]; ok {
					prevL4 = p.L4
				}
				f := l4Figures(cur.L4, prevL4, g.prev != nil, g.at.Sub(g.prevAt))
				gf.L4 = &f
				if s.l4 == nil {
					s.l4 = &store.L4Figures{}
				}
				s.l4.Add(f)
			}
			s.gateways[gw] = gf
			var prev store.ServiceTraffic
			if g.prev != nil {
				prev = g.prev[ns][svc]
			}
			s.regions = addRegions(s.regions, g.region, cur, prev, iv)
		}
	}
	if len(services) == 0 {
		return nil
	}
	out := make(map[string]store.ServiceTrafficStatus, len(services))
	for svc, s := range services {
		fleet := figures(s.requests, s.errors, s.open, s.sum)
		// The fleet's rate is the sum of the gateways' rates: their
		// intervals need not line up.
		fleet.Rate, fleet.BytesInRate, fleet.BytesOutRate = 0, 0, 0
		for _, f := range s.gateways {
			fleet.Rate += f.Rate
			fleet.BytesInRate += f.BytesInRate
			fleet.BytesOutRate += f.BytesOutRate
		}
		fleet.L4 = s.l4
		st := store.ServiceTrafficStatus{TrafficFigures: fleet, Gateways: s.gateways, Regions: s.regions}
		if len(st.Gateways) > maxGatewaysListed {
			names := make([]string, 0, len(st.Gateways))
			for gw := range st.Gateways {
				names = append(names, gw)
			}
			slices.SortFunc(names, func(x, y string) int {
				return cmp.Or(cmp.Compare(busy(st.Gateways[y]), busy(st.Gateways[x])), cmp.Compare(x, y))
			})
			for _, gw := range names[maxGatewaysListed:] {
				delete(st.Gateways, gw)
			}
		}
		out[svc] = st
	}
	return out
}

// busy is what a gateway carried of a service: its requests and its
// layer-4 connections, since it started.
func busy(f store.TrafficFigures) uint64 {
	if f.L4 == nil {
		return f.Requests
	}
	return f.Requests + f.L4.Total
}

// addRegions adds one gateway's traffic to one service, in region home,
// to the service's figures by region (made when the first figure comes);
// prev is the gateway's previous counters (zero when it has none) and iv
// its interval.
func addRegions(regions map[string]store.RegionTraffic, home string, cur, prev store.ServiceTraffic, iv interval) map[string]store.RegionTraffic {
	if home == "" && len(cur.ByRegion) == 0 {
		return regions
	}
	if regions == nil {
		regions = map[string]store.RegionTraffic{}
	}
	rate := func(n uint64) float64 {
		if iv.window <= 0 {
			return 0
		}
		return float64(n) / iv.window.Seconds()
	}
	var crossed, crossedIv uint64
	for r, n := range cur.ByRegion {
		// A counter that went backwards restarted from zero.
		d := n
		if p := prev.ByRegion[r]; p <= n {
			d = n - p
		}
		t := regions[r]
		t.Served += n
		t.ServedRate += rate(d)
		regions[r] = t
		if home != "" && r != home {
			crossed += n
			crossedIv += d
		}
	}
	t := regions[home]
	t.Arrived += cur.Requests()
	t.ArrivedRate += rate(iv.total)
	t.Crossed += crossed
	t.CrossedRate += rate(crossedIv)
	regions[home] = t
	return regions
}

// RegionTotals sums every service's traffic by region over the summaries:
// the fleet's traffic in each region.
func RegionTotals(sums map[string]store.NamespaceStatus) map[string]store.RegionTraffic {
	out := map[string]store.RegionTraffic{}
	for _, st := range sums {
		for _, svc := range st.Traffic {
			for r, t := range svc.Regions {
				sum := out[r]
				sum.Add(t)
				out[r] = sum
			}
		}
	}
	return out
}

// setAsideOf lists what each gateway sets aside of ns; a.mu is held.
func (a *Aggregator) setAsideOf(ns string) map[string][]store.EndpointSetAside {
	var out map[string][]store.EndpointSetAside
	n := 0
	for gw, g := range a.traffic {
		if len(g.aside[ns]) == 0 {
			continue
		}
		if out == nil {
			out = map[string][]store.EndpointSetAside{}
		}
		list := g.aside[ns]
		if n+len(list) > store.MaxSetAsideReported {
			list = list[:store.MaxSetAsideReported-n]
		}
		out[gw] = list
		if n += len(list); n == store.MaxSetAsideReported {
			break
		}
	}
	return out
}

var (
	trafficRateDesc = prometheus.NewDesc("edgeplane_fleet_service_requests_per_second",
		"Requests per second to a service, summed over the gateways' last reporting intervals.", []string{"namespace", "service"}, nil)
	trafficTotalDesc = prometheus.NewDesc("edgeplane_fleet_service_requests",
		"Requests to a service counted by the gateways reporting now, since each started (5xx: those answered with a server error).",
		[]string{"namespace", "service", "code_class"}, nil)
	trafficErrorRatioDesc = prometheus.NewDesc("edgeplane_fleet_service_error_ratio",
		"Share of a service's responses that were 5xx over the gateways' last intervals.", []string{"namespace", "service"}, nil)
	trafficLatencyDesc = prometheus.NewDesc("edgeplane_fleet_service_latency_seconds",
		"Latency quantiles (to response headers) of a service over the gateways' last intervals, from their merged histograms.",
		[]string{"namespace", "service", "quantile"}, nil)
	trafficRegionRateDesc = prometheus.NewDesc("edgeplane_fleet_region_requests_per_second",
		"Requests per second in a region over the gateways' last intervals, fleet-wide: served by its instances, arriving at its gateways, "+
			"and crossed (arriving there, served in another region).", []string{"region", "kind"}, nil)
)

// collectTraffic sends the flushed traffic figures; a.mu is held.
func (a *Aggregator) collectTraffic(ch chan<- prometheus.Metric) {
	for ns, st := range a.flushed {
		for svc, t := range st.Traffic {
			ch <- prometheus.MustNewConstMetric(trafficRateDesc, prometheus.GaugeValue, t.Rate, ns, svc)
			ch <- prometheus.MustNewConstMetric(trafficTotalDesc, prometheus.GaugeValue, float64(t.Requests), ns, svc, "all")
			ch <- prometheus.MustNewConstMetric(trafficTotalDesc, prometheus.GaugeValue, float64(t.Errors), ns, svc, "5xx")
			ch <- prometheus.MustNewConstMetric(trafficErrorRatioDesc, prometheus.GaugeValue, t.ErrorRatio, ns, svc)
			ch <- prometheus.MustNewConstMetric(trafficLatencyDesc, prometheus.GaugeValue, t.P50, ns, svc, "0.5")
			ch <- prometheus.MustNewConstMetric(trafficLatencyDesc, prometheus.GaugeValue, t.P99, ns, svc, "0.99")
			if t.L4 != nil {
				collectL4(ch, ns, svc, t.L4)
			}
		}
	}
	for r, t := range RegionTotals(a.flushed) {
		ch <- prometheus.MustNewConstMetric(trafficRegionRateDesc, prometheus.GaugeValue, t.ServedRate, r, "served")
		ch <- prometheus.MustNewConstMetric(trafficRegionRateDesc, prometheus.GaugeValue, t.ArrivedRate, r, "arrived")
		ch <- prometheus.MustNewConstMetric(trafficRegionRateDesc, prometheus.GaugeValue, t.CrossedRate, r, "crossed")
	}
}
