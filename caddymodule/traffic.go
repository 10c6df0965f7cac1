package caddymodule

import (
	"cmp"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Per-service traffic: the handler counts every request it routes by
// namespace and service (never host or path, so the label set stays as
// small as the routing table). The counters are plain atomics on the
// request path; /metrics reads them when scraped, and the projection
// reports them to the store every traffic interval (store.GatewayTraffic)
// for the control plane to sum. They live with the shared projection, so
// a config reload keeps counting.

// latencyBuckets is len(store.TrafficLatencyBounds)+1, fixed so that a
// service's counters are one allocation.
const latencyBuckets = 14

func init() {
	if len(store.TrafficLatencyBounds)+1 != latencyBuckets {
		panic("caddymodule: latencyBuckets does not match store.TrafficLatencyBounds")
	}
}

// serviceCounters are one service's counters.
type serviceCounters struct {
	namespace, service string
	classes            [5]atomic.Uint64
	bytesIn, bytesOut  atomic.Uint64
	open               atomic.Int64
	latency            [latencyBuckets]atomic.Uint64
	// canary counts each side of the service's split while a canary
	// routes it; nil otherwise.
	canary atomic.Pointer[canaryCounters]
	// byRegion counts the requests proxied to the service's instances
	// by the region of the instance's machine, indexed as the table's
	// regions are.
	byRegion [maxRegions]atomic.Uint64
	// l4 counts the service's layer-4 connections (layer4_handler.go).
	l4 l4Counters
	// accessSample bounds the access lines published (accesslog.go).
	accessSample accessSampler
}

// maxRegions bounds the regions counted apart; the requests to
// instances of regions beyond it (and to those without one) are counted
// in the service's totals only.
const maxRegions = 32

// canaryCounters count the two sides of one canary's split.
type canaryCounters struct {
	split store.Split
	sides [2]sideCounters
	// clients caps each client's cookie-routed requests counted.
	clients clientWindow
}

// admitCanary reports whether r, whose bucket cookie chose its side,
// counts in the canary's figures: at most canaryClientRate a second of
// one client's (clientOf), so that one client cannot outweigh the rest
// by repeating requests on the side its cookie holds.
func (c *serviceCounters) admitCanary(r *http.Request) bool {
	cc := c.canary.Load()
	return cc != nil && cc.clients.admit(clientOf(r), time.Now())
}

// sideCounters are one side's responses by class and latency.
type sideCounters struct {
	classes [5]atomic.Uint64
	latency [latencyBuckets]atomic.Uint64
}

// bucketsOf returns the status class and latency bucket of a response.
func bucketsOf(status int, latency time.Duration) (class, bucket int) {
	class = status/100 - 1
	if class < 0 || class > 4 {
		class = 4 // no valid status is a server error
	}
	bucket, _ = slices.BinarySearch(store.TrafficLatencyBounds, latency.Seconds())
	return class, bucket
}

func (c *sideCounters) snapshot(rev int64) store.RevisionCounts {
	out := store.RevisionCounts{Revision: rev, Latency: make([]uint64, latencyBuckets)}
	for i := range c.classes {
		out.Classes[i] = c.classes[i].Load()
	}
	for i := range c.latency {
		out.Latency[i] = c.latency[i].Load()
	}
	return out
}

// observe counts one finished request.
func (c *serviceCounters) observe(status int, latency time.Duration, in, out int64, side int) {
	class, i := bucketsOf(status, latency)
	c.classes[class].Add(1)
	c.latency[i].Add(1)
	if side != unsplit {
		if cc := c.canary.Load(); cc != nil {
			cc.sides[side].classes[class].Add(1)
			cc.sides[side].latency[i].Add(1)
		}
	}
	if in > 0 {
		c.bytesIn.Add(uint64(in))
	}
	if out > 0 {
		c.bytesOut.Add(uint64(out))
	}
}

// countRegion counts one request proxied to an instance in the region
// at index i (traffic.regionIndex); -1 counts nothing.
func (c *serviceCounters) countRegion(i int) {
	if i >= 0 {
		c.byRegion[i].Add(1)
	}
}

// snapshot reads c; regions names the region indexes.
func (c *serviceCounters) snapshot(regions []string) store.ServiceTraffic {
	t := store.ServiceTraffic{Namespace: c.namespace, Service: c.service, BytesIn: c.bytesIn.Load(),
		BytesOut: c.bytesOut.Load(), Open: c.open.Load(), Latency: make([]uint64, latencyBuckets)}
	for i := range c.classes {
		t.Classes[i] = c.classes[i].Load()
	}
	for i := range c.latency {
		t.Latency[i] = c.latency[i].Load()
	}
	for i, r := range regions {
		if n := c.byRegion[i].Load(); n > 0 {
			if t.ByRegion == nil {
				t.ByRegion = map[string]uint64{}
			}
			t.ByRegion[r] = n
		}
	}
	if cc := c.canary.Load(); cc != nil {
		t.Canary = &store.CanaryTraffic{Deploy: cc.split.Deploy,
			Old: cc.sides[sideOld].snapshot(cc.split.From), New: cc.sides[sideNew].snapshot(cc.split.Revision)}
	}
	t.L4 = c.l4.snapshot()
	return t
}

// trafficTable holds the counters of every service this gateway routed.
type trafficTable struct {
	since time.Time
	mu    sync.RWMutex
	byKey map[[2]string]*serviceCounters
	// regions are the regions counted apart, in the order their indexes
	// were given (regionIndex); they are only ever appended to.
	regions []string
	// home is the gateway's region now, for the metrics' labels.
	home func() string
	// counters is t.counters as a func value, made once: a closure made
	// per request would be an allocation per request.
	counters func(*projection.Service) any
	// catchUp, when set, brings the layer-4 byte counts of connections
	// under way up to date before a snapshot (l4Registry.catchUp).
	catchUp func()
}

func newTrafficTable() *trafficTable {
	t := &trafficTable{since: time.Now().UTC(), byKey: map[[2]string]*serviceCounters{}}
	t.counters = t.countersOf
	return t
}

// regionIndex is region's index in every service's byRegion, given on
// first use; -1 for no region, or one past maxRegions.
func (t *trafficTable) regionIndex(region string) int {
	if region == "" {
		return -1
	}
	t.mu.RLock()
	i := slices.Index(t.regions, region)
	t.mu.RUnlock()
	if i >= 0 {
		return i
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.regions, region); i >= 0 {
		return i
	}
	if len(t.regions) == maxRegions {
		return -1
	}
	t.regions = append(t.regions, region)
	return len(t.regions) - 1
}

type trafficMemo struct{}

// of returns svc's counters, made on first use; the answer is memoised on
// the immutable Service, so the request path pays a map lookup once per
// routing change, not per request.
func (t *trafficTable) of(svc *projection.Service) *serviceCounters {
	return svc.Memo(trafficMemo{}, t.counters).(*serviceCounters)
}

// countersOf returns s's counters, making them on first use.
func (t *trafficTable) countersOf(s *projection.Service) any {
	k := [2]string{s.Namespace, s.Name}
	t.mu.RLock()
	c := t.byKey[k]
	t.mu.RUnlock()
	if c == nil {
		t.mu.Lock()
		if c = t.byKey[k]; c == nil {
			c = &serviceCounters{namespace: s.Namespace, service: s.Name}
			t.byKey[k] = c
		}
		t.mu.Unlock()
	}
	// Once per routing change of the service: a new canary starts its
	// own counters (every step of one canary keeps counting in them), and
	// the end of the split drops them.
	switch cc := c.canary.Load(); {
	case s.Split == nil:
		c.canary.Store(nil)
	case cc == nil || cc.split.Deploy != s.Split.Deploy:
		c.canary.Store(&canaryCounters{split: *s.Split})
	}
	return c
}

// snapshot reads every service's counters, busiest first, at most max
// (0: all).
func (t *trafficTable) snapshot(max int) []store.ServiceTraffic {
	if t.catchUp != nil {
		t.catchUp()
	}
	t.mu.RLock()
	out := make([]store.ServiceTraffic, 0, len(t.byKey))
	for _, c := range t.byKey {
		out = append(out, c.snapshot(t.regions))
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b store.ServiceTraffic) int {
		if c := cmp.Compare(b.Requests(), a.Requests()); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Service, b.Service))
	})
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out
}

// serve runs h for r, counting it against c and writing its access line
// (al, accesslog.go). side is the split's side the request goes to, or
// unsplit.
func (c *serviceCounters) serve(w http.ResponseWriter, r *http.Request, h caddyhttp.MiddlewareHandler, next caddyhttp.Handler, side int, al accessRequest) error {
	start := time.Now()
	c.open.Add(1)
	tw := &trafficWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
	var body *countingBody
	// A request of length 0, not chunked, has no body bytes to count
	// (Caddy hands a bodiless GET on with a body that is not NoBody).
	if r.Body != nil && r.Body != http.NoBody && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		body = &countingBody{ReadCloser: r.Body}
		r.Body = body
	}
	var err error
	// Deferred: the proxy aborts a response it cannot finish (an upstream
	// that dropped mid-body) with panic(http.ErrAbortHandler), which must
	// neither leave the request open nor go uncounted.
	defer func() {
		c.open.Add(-1)
		status, headersAt := tw.status, tw.headersAt
		if err != nil && status == 0 {
			// Caddy writes the error response after the handler returns
			// (once headers went out, the client saw those, and they
			// count).
			status = http.StatusInternalServerError
			var herr caddyhttp.HandlerError
			if errors.As(err, &herr) && herr.StatusCode != 0 {
				status = herr.StatusCode
			}
		}
		if status == 0 {
			status = http.StatusOK // nothing written: an empty 200
		}
		if headersAt.IsZero() {
			headersAt = time.Now()
		}
		var in int64
		if body != nil {
			in = body.n
		}
		c.observe(status, headersAt.Sub(start), in, tw.bytes, side)
		if al.log != nil {
			al.write(c, r, status, in, tw.bytes, time.Since(start))
		}
	}()
	err = h.ServeHTTP(tw, r, next)
	return err
}

// trafficWriter notes a response's status, when its headers went out and
// how many body bytes followed.
type trafficWriter struct {
	caddyhttp.ResponseWriterWrapper
	status    int
	headersAt time.Time
	bytes     int64
}

func (w *trafficWriter) WriteHeader(code int) {
	// Informational answers other than a protocol switch come before the
	// real one.
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status, w.headersAt = code, time.Now()
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *trafficWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status, w.headersAt = http.StatusOK, time.Now()
	}
	n, err := w.ResponseWriterWrapper.Write(b)
	w.bytes += int64(n)
	return n, err
}

// ReadFrom keeps the wrapped writer's fast path and counts what it wrote.
func (w *trafficWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status, w.headersAt = http.StatusOK, time.Now()
	}
	n, err := w.ResponseWriterWrapper.ReadFrom(r)
	w.bytes += n
	return n, err
}

// countingBody counts the request body bytes read.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

// trafficCollector exports a trafficTable on /metrics.
type trafficCollector struct{ t *trafficTable }

var (
	descRequests = prometheus.NewDesc("edgeplane_service_requests_total",
		"Requests the gateway routed to a service, by status class of the response.", []string{"namespace", "service", "code_class"}, nil)
	descLatency = prometheus.NewDesc("edgeplane_service_request_duration_seconds",
		"Time from a request's arrival to its response headers, per service.", []string{"namespace", "service"}, nil)
	descBytesIn = prometheus.NewDesc("edgeplane_service_request_bytes_total",
		"Request body bytes the gateway read for a service.", []string{"namespace", "service"}, nil)
	descBytesOut = prometheus.NewDesc("edgeplane_service_response_bytes_total",
		"Response body bytes the gateway wrote for a service.", []string{"namespace", "service"}, nil)
	descOpen = prometheus.NewDesc("edgeplane_service_open_requests",
		"Requests to a service in progress (websockets and streams included).", []string{"namespace", "service"}, nil)
	descByRegion = prometheus.NewDesc("edgeplane_gateway_requests_by_region_total",
		"Requests the gateway proxied to a service's instances, by the gateway's region and the region of the instance's machine.",
		[]string{"namespace", "service", "gateway_region", "instance_region"}, nil)
	descL4Open = prometheus.NewDesc("edgeplane_gateway_l4_connections_open",
		"Layer-4 connections to a service's instances in progress.", []string{"namespace", "service"}, nil)
	descL4Total = prometheus.NewDesc("edgeplane_gateway_l4_connections_total",
		"Layer-4 connections the gateway proxied to a service's instances.", []string{"namespace", "service"}, nil)
	descL4Bytes = prometheus.NewDesc("edgeplane_gateway_l4_bytes_total",
		"Bytes of a service's layer-4 connections: in from clients to instances, out the other way.", []string{"namespace", "service", "direction"}, nil)
	descL4ConnectErrors = prometheus.NewDesc("edgeplane_gateway_l4_connect_errors_total",
		"Dials to a service's instances for layer-4 connections that failed.", []string{"namespace", "service"}, nil)
)

var codeClasses = [5]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

func (c trafficCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descLatency, descBytesIn, descBytesOut, descOpen, descByRegion,
		descL4Open, descL4Total, descL4Bytes, descL4ConnectErrors} {
		ch <- d
	}
}

func (c trafficCollector) Collect(ch chan<- prometheus.Metric) {
	var home string
	if c.t.home != nil {
		home = c.t.home()
	}
	for _, s := range c.t.snapshot(0) {
		for r, n := range s.ByRegion {
			ch <- prometheus.MustNewConstMetric(descByRegion, prometheus.CounterValue, float64(n), s.Namespace, s.Service, home, r)
		}
		for i, n := range s.Classes {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), s.Namespace, s.Service, codeClasses[i])
		}
		buckets := make(map[float64]uint64, len(store.TrafficLatencyBounds))
		var cum uint64
		for i, b := range store.TrafficLatencyBounds {
			cum += s.Latency[i]
			buckets[b] = cum
		}
		// The sum is not kept (it would cost a float add per request);
		// rates and quantiles come from the counts and buckets.
		ch <- prometheus.MustNewConstHistogram(descLatency, cum+s.Latency[latencyBuckets-1], 0, buckets, s.Namespace, s.Service)
		ch <- prometheus.MustNewConstMetric(descBytesIn, prometheus.CounterValue, float64(s.BytesIn), s.Namespace, s.Service)
		ch <- prometheus.MustNewConstMetric(descBytesOut, prometheus.CounterValue, float64(s.BytesOut), s.Namespace, s.Service)
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(s.Open), s.Namespace, s.Service)
		if l := s.L4; l != nil {
			ch <- prometheus.MustNewConstMetric(descL4Open, prometheus.GaugeValue, float64(l.Open), s.Namespace, s.Service)
			ch <- prometheus.MustNewConstMetric(descL4Total, prometheus.CounterValue, float64(l.Total), s.Namespace, s.Service)
			ch <- prometheus.MustNewConstMetric(descL4Bytes, prometheus.CounterValue, float64(l.BytesIn), s.Namespace, s.Service, "in")
			ch <- prometheus.MustNewConstMetric(descL4Bytes, prometheus.CounterValue, float64(l.BytesOut), s.Namespace, s.Service, "out")
			ch <- prometheus.MustNewConstMetric(descL4ConnectErrors, prometheus.CounterValue, float64(l.ConnectErrors), s.Namespace, s.Service)
		}
	}
}
