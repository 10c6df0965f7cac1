package fleet

// The aggregator as a Prometheus collector: what it last flushed.

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	instancesDesc = prometheus.NewDesc("edgeplane_fleet_instances", "Instances per namespace and state, as last flushed (stale: on a machine whose heartbeat is stale or offline).",
		[]string{"namespace", "state"}, nil)
	lagDesc    = prometheus.NewDesc("edgeplane_fleet_status_lag_seconds", "From the oldest change in the last flush to that flush.", nil, nil)
	leaderDesc = prometheus.NewDesc("edgeplane_fleet_status_writer", "1 while this control server writes the fleet status, 0 while it stands by.", nil, nil)
)

// Describe implements prometheus.Collector.
func (a *Aggregator) Describe(ch chan<- *prometheus.Desc) {
	ch <- instancesDesc
	ch <- lagDesc
	ch <- leaderDesc
	for _, d := range []*prometheus.Desc{trafficRateDesc, trafficTotalDesc, trafficErrorRatioDesc, trafficLatencyDesc, trafficRegionRateDesc} {
		ch <- d
	}
	for _, d := range l4Descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (a *Aggregator) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ns, st := range a.flushed {
		c := st.Counts
		for state, n := range map[string]int{"ready": c.Ready, "starting": c.Starting, "backoff": c.Backoff, "failed": c.Failed,
			"draining": c.Draining, "stopped": c.Stopped, "stale": c.Stale} {
			ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(n), ns, state)
		}
	}
	a.collectTraffic(ch)
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, a.lastLag.Seconds())
	leading := 0.0
	if a.leading.Load() {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leading)
}
