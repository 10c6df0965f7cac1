package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/store"
)

// Collector reports the agent's instances (edgeplane_agent_*) at scrape
// time, from what it holds in memory.
func (a *Agent) Collector() prometheus.Collector { return collector{a} }

var (
	instancesDesc = prometheus.NewDesc("edgeplane_agent_instances",
		"Instances this agent runs, by state (backoff: ended and waiting to be restarted).", []string{"state"}, nil)
	instanceRestartsDesc = prometheus.NewDesc("edgeplane_agent_instance_restarts",
		"Restarts of each instance by its agent after it ended on its own.", []string{"namespace", "service", "instance"}, nil)
	restartsDesc = prometheus.NewDesc("edgeplane_agent_restarts_total",
		"Restarts of instances since this agent started.", nil, nil)
)

type collector struct{ a *Agent }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- instancesDesc
	ch <- instanceRestartsDesc
	ch <- restartsDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	var recs []store.InstanceRecord
	a.locked(func() {
		for _, inst := range a.instances {
			recs = append(recs, inst.Record)
		}
	})
	byState := map[string]int{}
	for _, r := range recs {
		byState[string(r.State)]++
		ch <- prometheus.MustNewConstMetric(instanceRestartsDesc, prometheus.GaugeValue, float64(r.Restarts), r.Namespace, r.Service, r.ID)
	}
	for state, n := range byState {
		ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(restartsDesc, prometheus.CounterValue, float64(a.restarts.Load()))
}
