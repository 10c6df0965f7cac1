package dnsproj

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus collectors. Label values come from
// small fixed sets (known query types, rcodes) so a hostile client cannot
// blow up the series count.
type metrics struct {
	queries       *prometheus.CounterVec
	cacheHits     prometheus.Counter
	cacheMisses   prometheus.Counter
	cacheEntries  prometheus.Gauge
	forwards      *prometheus.CounterVec
	forwardErrors *prometheus.CounterVec
	upstreamUp    *prometheus.GaugeVec
	viewSeq       prometheus.Gauge
	viewStale     prometheus.Gauge

	// hot caches the per-(proto, type, rcode) counters so the query path
	// does one atomic load instead of a labelled map lookup.
	hot [2][len(metricTypes) + 1][maxMetricRcode + 2]atomic.Pointer[prometheus.Counter]
}

// metricTypes are the query types counted under their own label; the rest
// count as "other".
var metricTypes = [...]uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeSOA, dns.TypeNS, dns.TypePTR,
	dns.TypeMX, dns.TypeTXT, dns.TypeCNAME, dns.TypeANY, dns.TypeHTTPS, dns.TypeSVCB,
	dns.TypeDS, dns.TypeDNSKEY, dns.TypeAXFR, dns.TypeIXFR,
}

const maxMetricRcode = dns.RcodeBadCookie

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "queries_total",
			Help: "DNS queries answered, by transport, query type and response code.",
		}, []string{"proto", "type", "rcode"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "cache_hits_total",
			Help: "Queries for names outside the zone answered from the cache.",
		}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "cache_misses_total",
			Help: "Queries for names outside the zone not found in the cache.",
		}),
		cacheEntries: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "cache_entries",
			Help: "Answers held in the cache.",
		}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "forward_requests_total",
			Help: "Queries sent to an upstream resolver.",
		}, []string{"to"}),
		forwardErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "forward_errors_total",
			Help: "Queries an upstream resolver failed to answer (timeout, refused connection, bad reply).",
		}, []string{"to"}),
		upstreamUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "forward_upstream_healthy",
			Help: "1 while an upstream resolver passes health checks, else 0.",
		}, []string{"to"}),
		viewSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "zone_routing_seq",
			Help: "Routing stream sequence of the projection view the zone answers from.",
		}),
		viewStale: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "edgeplane", Subsystem: "dns", Name: "zone_stale",
			Help: "1 while the zone answers from a view not confirmed by the store (loaded from the local snapshot), else 0.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	errs := []error{
		register(reg, &m.queries), register(reg, &m.cacheHits), register(reg, &m.cacheMisses),
		register(reg, &m.cacheEntries), register(reg, &m.forwards), register(reg, &m.forwardErrors),
		register(reg, &m.upstreamUp), register(reg, &m.viewSeq), register(reg, &m.viewStale),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("registering dns metrics: %w", err)
	}
	return m, nil
}

// register registers *c, or, when an equal collector is already registered
// (a second server in one process), points *c at that one so both count
// into the same series.
func register[T prometheus.Collector](reg prometheus.Registerer, c *T) error {
	err := reg.Register(*c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			*c = existing
			return nil
		}
	}
	return err
}

// countQuery counts one answered query.
func (m *metrics) countQuery(tcp bool, qtype uint16, rcode int) {
	p := 0
	if tcp {
		p = 1
	}
	t := len(metricTypes)
	for i, mt := range metricTypes {
		if mt == qtype {
			t = i
			break
		}
	}
	r := rcode
	if r < 0 || r > maxMetricRcode {
		r = maxMetricRcode + 1
	}
	slot := &m.hot[p][t][r]
	if c := slot.Load(); c != nil {
		(*c).Inc()
		return
	}
	c := m.queries.WithLabelValues(protoLabel(tcp), typeLabel(t), rcodeLabel(r))
	slot.Store(&c)
	c.Inc()
}

func protoLabel(tcp bool) string {
	if tcp {
		return "tcp"
	}
	return "udp"
}

func typeLabel(i int) string {
	if i >= len(metricTypes) {
		return "other"
	}
	return dns.TypeToString[metricTypes[i]]
}

func rcodeLabel(r int) string {
	if r > maxMetricRcode {
		return "other"
	}
	if s, ok := dns.RcodeToString[r]; ok {
		return s
	}
	return strconv.Itoa(r)
}
