package fleet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/store"
)

// Layer-4 traffic. A gateway counts a service's layer-4 connections
// beside its requests (store.ServiceTraffic.L4), cumulative as they are;
// the aggregator differences a gateway's last two reports into rates, as
// for requests, and sums the gateways into the fleet's figures. A service
// reached only below HTTP may carry no latency histogram: its report is
// kept for its connections alone.

// l4Figures is one gateway's layer-4 figures for one service: cur's
// counts, and rates over window from prev (nil: the counts are all new
// this interval) when the gateway has a previous report (hasPrev).
func l4Figures(cur, prev *store.L4Traffic, hasPrev bool, window time.Duration) store.L4Figures {
	f := store.L4Figures{Open: cur.Open, Total: cur.Total, BytesIn: cur.BytesIn, BytesOut: cur.BytesOut,
		ConnectErrors: cur.ConnectErrors, Refused: cur.Refused}
	if !hasPrev || window <= 0 {
		return f
	}
	if prev == nil {
		prev = &store.L4Traffic{}
	}
	secs := window.Seconds()
	rate := func(c, p uint64) float64 {
		if c < p { // restarted from zero
			return float64(c) / secs
		}
		return float64(c-p) / secs
	}
	f.Rate = rate(cur.Total, prev.Total)
	f.BytesInRate, f.BytesOutRate = rate(cur.BytesIn, prev.BytesIn), rate(cur.BytesOut, prev.BytesOut)
	f.ConnectErrorRate, f.RefusedRate = rate(cur.ConnectErrors, prev.ConnectErrors), rate(cur.Refused, prev.Refused)
	return f
}

// l4Only keeps of a report's service its layer-4 counters, for a service
// whose latency histogram is not comparable (or absent): its requests are
// not counted, its connections are.
func l4Only(s store.ServiceTraffic) store.ServiceTraffic {
	return store.ServiceTraffic{Namespace: s.Namespace, Service: s.Service, L4: s.L4,
		Latency: make([]uint64, len(store.TrafficLatencyBounds)+1)}
}

var (
	l4OpenDesc = prometheus.NewDesc("edgeplane_fleet_service_l4_connections_open",
		"Layer-4 connections to a service open now, summed over the gateways.", []string{"namespace", "service"}, nil)
	l4RateDesc = prometheus.NewDesc("edgeplane_fleet_service_l4_connections_per_second",
		"New layer-4 connections per second to a service, summed over the gateways' last intervals.", []string{"namespace", "service"}, nil)
	l4BytesRateDesc = prometheus.NewDesc("edgeplane_fleet_service_l4_bytes_per_second",
		"Layer-4 bytes per second of a service (in: from clients, out: to them), summed over the gateways' last intervals.",
		[]string{"namespace", "service", "direction"}, nil)
	l4ErrorsDesc = prometheus.NewDesc("edgeplane_fleet_service_l4_connect_errors",
		"Failed dials to a service's instances counted by the gateways reporting now, since each started (refused: client connections no instance took).",
		[]string{"namespace", "service", "kind"}, nil)
)

// l4Descs are the layer-4 metrics' descriptions.
var l4Descs = []*prometheus.Desc{l4OpenDesc, l4RateDesc, l4BytesRateDesc, l4ErrorsDesc}

// collectL4 sends one service's flushed layer-4 figures.
func collectL4(ch chan<- prometheus.Metric, ns, svc string, f *store.L4Figures) {
	ch <- prometheus.MustNewConstMetric(l4OpenDesc, prometheus.GaugeValue, float64(f.Open), ns, svc)
	ch <- prometheus.MustNewConstMetric(l4RateDesc, prometheus.GaugeValue, f.Rate, ns, svc)
	ch <- prometheus.MustNewConstMetric(l4BytesRateDesc, prometheus.GaugeValue, f.BytesInRate, ns, svc, "in")
	ch <- prometheus.MustNewConstMetric(l4BytesRateDesc, prometheus.GaugeValue, f.BytesOutRate, ns, svc, "out")
	ch <- prometheus.MustNewConstMetric(l4ErrorsDesc, prometheus.GaugeValue, float64(f.ConnectErrors), ns, svc, "connect")
	ch <- prometheus.MustNewConstMetric(l4ErrorsDesc, prometheus.GaugeValue, float64(f.Refused), ns, svc, "refused")
}
