package projection

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics adds p's figures (edgeplane_projection_*) to reg; the
// values are read from p at scrape time. In Caddy each config has its own
// registry, so a reload registers afresh.
func RegisterMetrics(reg *prometheus.Registry, p *Projection) error {
	if reg == nil {
		return nil
	}
	status := func(f func(Status) float64) func() float64 {
		return func() float64 { return f(p.Status()) }
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	const ns, sub = "edgeplane", "projection"
	cs := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_applied_total",
			Help: "Routing events applied to the gateway's projection."},
			status(func(s Status) float64 { return float64(s.EventsApplied) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_events_total",
			Help: "Routing events skipped because they could not be decoded or applied."},
			status(func(s Status) float64 { return float64(s.BadEvents) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dropped_events_total",
			Help: "Republished routing events NATS dropped before the projection read them (read again from the stream): 0 unless a burst outgrew what the subscription may hold."},
			status(func(s Status) float64 { return float64(s.Dropped) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_events_total",
			Help: "Routing events not applied because their signature did not verify; their services kept their last good state."},
			status(func(s Status) float64 { return float64(s.Signatures.Refused) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_endpoints_total",
			Help: "Endpoints of signed routing events not dialled because their machine's admitted address is not theirs (a rebuild counts them again)."},
			status(func(s Status) float64 { return float64(s.Endpoints.Refused) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "endpoints_set_aside",
			Help: "Endpoints the projection does not dial now: their machine's admitted address is not theirs."},
			status(func(s Status) float64 { return float64(s.Endpoints.SetAside) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rebuilds_total",
			Help: "Rebuilds of the projection from stored state after freshness became uncertain."},
			status(func(s Status) float64 { return float64(s.Rebuilds) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "lag_seqs",
			Help: "Routing events in the stream not yet applied."},
			status(func(s Status) float64 { return float64(s.LagSeqs) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "lag_seconds",
			Help: "How long the projection has been behind the stream head."},
			status(func(s Status) float64 { return s.LagSeconds })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "applied_seq",
			Help: "Last routing stream sequence applied."},
			status(func(s Status) float64 { return float64(s.AppliedSeq) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "routable_instances",
			Help: "Routable instances in the projection."},
			status(func(s Status) float64 { return float64(s.Routable) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "services",
			Help: "Services in the projection."},
			status(func(s Status) float64 { return float64(s.Services) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "host_conflicts",
			Help: "Hosts routed by more than one namespace; only the owner (the lowest namespace) is served."},
			status(func(s Status) float64 { return float64(len(s.HostConflicts)) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "connected",
			Help: "1 while the projection is connected to NATS."},
			status(func(s Status) float64 { return b2f(s.Connected) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "stale",
			Help: "1 while the gateway serves a view that may be behind the store."},
			status(func(s Status) float64 { return b2f(s.Stale) })),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				// A re-provision of the same config registered these
				// already.
				continue
			}
			return err
		}
	}
	return nil
}
