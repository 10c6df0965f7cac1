package caddystorage

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics adds the storage's figures to the registry of the config
// being loaded; they are read from the module instance's storage at scrape
// time (zero before it exists).
func registerMetrics(reg *prometheus.Registry, c *conn) error {
	if reg == nil {
		return nil
	}
	read := func(f func(connected bool, localReads, refused uint64) float64) func() float64 {
		return func() float64 {
			c.mu.Lock()
			st := c.storage
			c.mu.Unlock()
			if st == nil {
				return f(false, 0, 0)
			}
			return f(st.Connected(), st.LocalReads(), st.Refused())
		}
	}
	const ns, sub = "edgeplane", "certstore"
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "connected",
			Help: "1 while the certificate store (NATS) answers."},
			read(func(connected bool, _, _ uint64) float64 {
				if connected {
					return 1
				}
				return 0
			})),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "local_reads_total",
			Help: "Certificate reads answered from the local copy because the store was unreachable."},
			read(func(_ bool, n, _ uint64) float64 { return float64(n) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_total",
			Help: "Certificate writes and locks refused with store_unavailable."},
			read(func(_ bool, _, n uint64) float64 { return float64(n) })),
	}
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue // a re-provision of the same config
			}
			return err
		}
	}
	return nil
}
