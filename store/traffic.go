package store

import (
	"context"
	"math"
	"time"
)

// Per-service traffic. Every gateway counts the requests it routes per
// namespace and service and writes its counters, cumulative since it
// started, to the gateway traffic bucket every few seconds (an observation
// that ages out with the gateway); control/fleet's aggregator sums them
// into each namespace's summary. Cumulative counters make a lost or late
// report cost resolution, never counts: the next one carries them.

// TrafficLatencyBounds are the upper bounds, in seconds, of the latency
// histogram every gateway keeps per service (time to response headers);
// a last bucket holds everything slower. Gateways and the aggregator must
// agree on them: a report whose histogram has another length is ignored.
var TrafficLatencyBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// ServiceTraffic is one service's counters at one gateway.
type ServiceTraffic struct {
	Namespace string `json:"ns"`
	Service   string `json:"svc"`
	// Classes counts responses by status class: [0] 1xx ... [4] 5xx.
	Classes [5]uint64 `json:"classes"`
	// BytesIn and BytesOut are request and response body bytes.
	BytesIn  uint64 `json:"in,omitempty"`
	BytesOut uint64 `json:"out,omitempty"`
	// Open is the requests in progress now (websockets and streams
	// included): a gauge, not a counter.
	Open int64 `json:"open,omitempty"`
	// Latency counts responses per TrafficLatencyBounds bucket (not
	// cumulative across buckets), the last being the overflow.
	Latency []uint64 `json:"lat"`
	// Canary splits the service's requests by side while a canary routes
	// it (Split).
	Canary *CanaryTraffic `json:"canary,omitempty"`
	// ByRegion counts the requests proxied to the service's instances by
	// the region of the instance's machine ("" for none), cumulative.
	ByRegion map[string]uint64 `json:"by_region,omitempty"`
	// L4 counts the service's layer-4 connections, when it has any.
	L4 *L4Traffic `json:"l4,omitempty"`
}

// Requests is every response counted.
func (t *ServiceTraffic) Requests() uint64 {
	var n uint64
	for _, c := range t.Classes {
		n += c
	}
	return n
}

// GatewayTraffic is what one gateway reports of its traffic. Key: the
// gateway (GatewayKey).
type GatewayTraffic struct {
	Version int    `json:"version"`
	Gateway string `json:"gateway"`
	// Region is the gateway's own region ("" for none).
	Region string `json:"region,omitempty"`
	// Since is when the gateway's counters started: a reader seeing it
	// change knows the counters restarted from zero.
	Since    time.Time        `json:"since"`
	At       time.Time        `json:"at"`
	Services []ServiceTraffic `json:"services"`
	// SetAside are the endpoints the gateway sends no new request to now
	// (their probe failed, or their machine stopped beating), at most
	// MaxSetAsideReported.
	SetAside []EndpointSetAside `json:"set_aside,omitempty"`
}

// EndpointSetAside is one endpoint a gateway sets aside, and why.
type EndpointSetAside struct {
	Namespace string    `json:"ns"`
	Service   string    `json:"svc"`
	Instance  string    `json:"instance"`
	Machine   string    `json:"machine"`
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
	// FailOpen is set when the service has no other endpoint, so the
	// gateway serves this one anyway.
	FailOpen bool `json:"fail_open,omitempty"`
}

// MaxSetAsideReported bounds the set-aside endpoints one report names.
const MaxSetAsideReported = 1000

func (r *GatewayTraffic) version() int { return r.Version }

// KeyOK checks the report is filed under the gateway it names.
func (r *GatewayTraffic) KeyOK(key string) error { return keyMust(key, GatewayKey(r.Gateway)) }

// MaxTrafficServices bounds the services one report carries, so that it
// fits the bucket's value size; a gateway routing more reports the busiest.
const MaxTrafficServices = 4000

// PutGatewayTraffic writes gateway t.Gateway's traffic report.
func (s *Store) PutGatewayTraffic(ctx context.Context, t *GatewayTraffic) error {
	t.Version = RecordVersion
	_, err := PutJSON(ctx, s.gatewayTraffic, GatewayKey(t.Gateway), t)
	return err
}

// TrafficFigures are a service's traffic over a recent window, from one
// gateway or summed over the fleet.
type TrafficFigures struct {
	// Requests is every response counted by the gateways reporting now,
	// since each started; Errors the 5xx among them.
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors_5xx"`
	// Rate is requests per second over the window; ErrorRatio the share
	// of 5xx among the window's responses.
	Rate       float64 `json:"rate"`
	ErrorRatio float64 `json:"error_ratio"`
	// P50 and P99 are latency quantiles (seconds, to response headers) of
	// the window's responses, estimated from the merged histograms;
	// zero with no response in the window.
	P50 float64 `json:"p50_s"`
	P99 float64 `json:"p99_s"`
	// BytesInRate and BytesOutRate are body bytes per second.
	BytesInRate  float64 `json:"bytes_in_rate,omitempty"`
	BytesOutRate float64 `json:"bytes_out_rate,omitempty"`
	Open         int64   `json:"open,omitempty"`
	// Window is the span the rates cover.
	Window Duration `json:"window,omitempty"`
	// L4 is the service's layer-4 connections, when a gateway reports
	// any.
	L4 *L4Figures `json:"l4,omitempty"`
}

// L4Figures are a service's layer-4 connections over a recent window,
// from one gateway or summed over the fleet: counts since each reporting
// gateway started (Open: now), rates per second over their last
// intervals.
type L4Figures struct {
	Open          int64  `json:"open"`
	Total         uint64 `json:"total"`
	BytesIn       uint64 `json:"bytes_in,omitempty"`
	BytesOut      uint64 `json:"bytes_out,omitempty"`
	ConnectErrors uint64 `json:"connect_errors,omitempty"`
	Refused       uint64 `json:"refused,omitempty"`
	// Rate is new connections per second.
	Rate             float64 `json:"rate"`
	BytesInRate      float64 `json:"bytes_in_rate,omitempty"`
	BytesOutRate     float64 `json:"bytes_out_rate,omitempty"`
	ConnectErrorRate float64 `json:"connect_error_rate,omitempty"`
	RefusedRate      float64 `json:"refused_rate,omitempty"`
}

// Add adds o's counts and rates to f.
func (f *L4Figures) Add(o L4Figures) {
	f.Open += o.Open
	f.Total += o.Total
	f.BytesIn += o.BytesIn
	f.BytesOut += o.BytesOut
	f.ConnectErrors += o.ConnectErrors
	f.Refused += o.Refused
	f.Rate += o.Rate
	f.BytesInRate += o.BytesInRate
	f.BytesOutRate += o.BytesOutRate
	f.ConnectErrorRate += o.ConnectErrorRate
	f.RefusedRate += o.RefusedRate
}

// ServiceTrafficStatus is a service's traffic fleet-wide and per gateway.
type ServiceTrafficStatus struct {
	TrafficFigures
	Gateways map[string]TrafficFigures `json:"gateways,omitempty"`
	// Regions is the service's traffic by region ("" for machines and
	// gateways without one), when gateways report regions.
	Regions map[string]RegionTraffic `json:"regions,omitempty"`
}

// RegionTraffic is traffic in one region: counts are since each reporting
// gateway started, rates over their last intervals (as TrafficFigures).
type RegionTraffic struct {
	// Served counts the requests proxied to instances on the region's
	// machines, by any gateway.
	Served     uint64  `json:"served"`
	ServedRate float64 `json:"served_rate"`
	// Arrived counts the requests the region's gateways answered.
	Arrived     uint64  `json:"arrived"`
	ArrivedRate float64 `json:"arrived_rate"`
	// Crossed counts the requests the region's gateways proxied to an
	// instance in another region (or in none); a gateway without a region
	// crosses nothing.
	Crossed     uint64  `json:"crossed"`
	CrossedRate float64 `json:"crossed_rate"`
}

// Add adds o's counts and rates to t.
func (t *RegionTraffic) Add(o RegionTraffic) {
	t.Served += o.Served
	t.ServedRate += o.ServedRate
	t.Arrived += o.Arrived
	t.ArrivedRate += o.ArrivedRate
	t.Crossed += o.Crossed
	t.CrossedRate += o.CrossedRate
}

// CrossShare is the share of the requests arriving at the region's
// gateways that crossed to another region: over the last intervals when
// they carried any, else since the gateways started.
func (t RegionTraffic) CrossShare() float64 {
	if t.ArrivedRate > 0 {
		return min(1, t.CrossedRate/t.ArrivedRate)
	}
	if t.Arrived > 0 {
		return min(1, float64(t.Crossed)/float64(t.Arrived))
	}
	return 0
}

// LatencyQuantile estimates quantile q (0..1) of the latencies counted in
// buckets (per TrafficLatencyBounds) by linear interpolation within the
// bucket it falls in, as Prometheus' histogram_quantile does; the
// overflow bucket answers its lower bound.
func LatencyQuantile(q float64, buckets []uint64) float64 {
	var total uint64
	for _, c := range buckets {
		total += c
	}
	if total == 0 || len(buckets) != len(TrafficLatencyBounds)+1 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, c := range buckets {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			if i == len(TrafficLatencyBounds) {
				return TrafficLatencyBounds[i-1]
			}
			lo := 0.0
			if i > 0 {
				lo = TrafficLatencyBounds[i-1]
			}
			frac := math.Max(0, (rank-seen)/float64(c))
			return lo + (TrafficLatencyBounds[i]-lo)*frac
		}
		seen += float64(c)
	}
	return TrafficLatencyBounds[len(TrafficLatencyBounds)-1]
}
