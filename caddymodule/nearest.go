package caddymodule

import (
	"context"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
)

// Measured distance to the other regions. A gateway that must serve a
// service from outside its region (locality prefer, when home cannot)
// tries the regions the service's locality order names, then the others
// nearest first (projection.View.Tiers' nearest). Nearest is measured
// here, not configured: every region_probe_interval the gateway times a
// TCP connect (one round trip: SYN, SYN-ACK, answered by the kernel even
// when the instance is busy) to one routable endpoint of each other
// region, taking each region's endpoints in turn, and keeps the median
// of each region's last rttSamples samples, so that one slow handshake
// does not reorder regions. A connect that fails says nothing about
// distance and is no sample. Two regions swap places in the order only
// when one is nearer by more than a tenth (at least a millisecond): the
// order changes when distances do, not with jitter, and the gateway's
// caches keyed on its version stay warm.

// DefaultRegionProbeInterval is how often each other region's round trip
// is measured unless configured.
const DefaultRegionProbeInterval = 10 * time.Second

const (
	// regionProbeTimeout bounds one connect: a SYN lost and resent (after
	// 1 s on Linux) would be no round trip worth a sample anyway.
	regionProbeTimeout = time.Second
	// rttSamples is how many samples per region the median is taken of.
	rttSamples = 5
	// rttChangeCoalesce is the least time between two rounds triggered by
	// view changes (a deploy swaps views in bursts).
	rttChangeCoalesce = time.Second
)

// regionRTT measures the round trip from this gateway to every other
// region of the view. Create it with newRegionRTT, drive it with run;
// nearest and snapshot may be called from any goroutine, and on a nil
// *regionRTT (measuring disabled).
type regionRTT struct {
	interval, timeout time.Duration
	view              func() *projection.View
	// changed returns a channel closed at the next view swap.
	changed func() <-chan struct{}
	// home is this gateway's region ("" when it has none); its own
	// region is never probed nor in the order.
	home   func() string
	logger *zap.Logger
	// dial opens a TCP connection; a test adds distance to it.
	dial func(ctx context.Context, addr string) (net.Conn, error)

	// mu guards regions: the run goroutine writes, snapshot reads.
	mu      sync.Mutex
	regions map[string]*rttWindow

	order atomic.Pointer[nearestOrder]
}

// rttWindow is one region's last samples and its turn among endpoints.
type rttWindow struct {
	samples [rttSamples]time.Duration
	n, next int // samples held; where the next goes
	turn    int // the endpoint to probe next, modulo the region's endpoints
	tried   bool
}

func (w *rttWindow) add(d time.Duration) {
	w.samples[w.next] = d
	w.next = (w.next + 1) % rttSamples
	w.n = min(w.n+1, rttSamples)
}

// median is the median of the samples held; 0 without any.
func (w *rttWindow) median() time.Duration {
	if w.n == 0 {
		return 0
	}
	s := make([]time.Duration, w.n)
	copy(s, w.samples[:w.n])
	slices.Sort(s)
	if w.n%2 == 1 {
		return s[w.n/2]
	}
	return (s[w.n/2-1] + s[w.n/2]) / 2
}

// nearestOrder is an order of regions and its version.
type nearestOrder struct {
	regions []string
	version uint64
}

func newRegionRTT(interval time.Duration, view func() *projection.View, changed func() <-chan struct{}, home func() string, logger *zap.Logger) *regionRTT {
	dialer := &net.Dialer{}
	return &regionRTT{
		interval: interval, timeout: min(regionProbeTimeout, interval),
		view: view, changed: changed, home: home, logger: logger,
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		},
		regions: map[string]*rttWindow{},
	}
}

// nearest returns the regions other than this gateway's, nearest first
// (measured ones by their median round trip, then those not measured
// yet, by name), for View.Tiers' nearest, and the order's version, which
// changes only when the order does. The slice is shared: read it, never
// change it. A nil n (measuring disabled) returns nil, 0.
func (n *regionRTT) nearest() (order []string, version uint64) {
	if n == nil {
		return nil, 0
	}
	o := n.order.Load()
	if o == nil {
		return nil, 0
	}
	return o.regions, o.version
}

// snapshot returns each measured region's round trip (the median of its
// last samples), for the admin API and metrics; nil when n is nil.
func (n *regionRTT) snapshot() map[string]time.Duration {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]time.Duration, len(n.regions))
	for r, w := range n.regions {
		if m := w.median(); m > 0 {
			out[r] = m
		}
	}
	return out
}

// run measures every interval, and the regions never tried yet as soon
// as a view shows them, until ctx ends.
func (n *regionRTT) run(ctx context.Context) {
	t := time.NewTicker(n.interval)
	defer t.Stop()
	all := true
	for {
		changed := n.changed()
		n.round(ctx, all)
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			all = true
		case <-changed:
			all = false
			// A burst of swaps makes one round.
			select {
			case <-ctx.Done():
				return
			case <-time.After(rttChangeCoalesce):
			}
		}
	}
}

// round probes the other regions of the current view (all of them, or
// only those never tried), one connect per region, the regions in
// parallel, then orders them anew.
func (n *regionRTT) round(ctx context.Context, all bool) {
	v, home := n.view(), n.home()
	known := v.KnownRegions()
	n.mu.Lock()
	for r := range n.regions {
		if r == home || !slices.Contains(known, r) {
			delete(n.regions, r)
		}
	}
	var due []string
	for _, r := range known {
		if r == home {
			continue
		}
		w := n.regions[r]
		if w == nil {
			w = &rttWindow{}
			n.regions[r] = w
		}
		if all || !w.tried {
			due = append(due, r)
		}
	}
	n.mu.Unlock()
	if len(due) > 0 {
		targets := regionTargets(v, due)
		var wg sync.WaitGroup
		for _, r := range due {
			if len(targets[r]) == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.probe(ctx, r, targets[r])
			}()
		}
		wg.Wait()
	}
	n.reorder(known, home)
}

// regionTargets lists, for each of regions, the dial addresses of its
// routable endpoints on machines not judged down, sorted.
func regionTargets(v *projection.View, regions []string) map[string][]string {
	out := make(map[string][]string, len(regions))
	seen := map[string]bool{}
	for _, s := range v.Services() {
		for _, e := range s.Endpoints {
			r := v.RegionOf(e)
			if r == "" || !slices.Contains(regions, r) {
				continue
			}
			if _, down := v.Down(e.Machine); down {
				continue
			}
			addr := net.JoinHostPort(e.Address, strconv.Itoa(e.Port))
			if !seen[addr] {
				seen[addr] = true
				out[r] = append(out[r], addr)
			}
		}
	}
	for _, addrs := range out {
		sort.Strings(addrs)
	}
	return out
}

// probe times one connect to the region's next endpoint in turn.
func (n *regionRTT) probe(ctx context.Context, region string, addrs []string) {
	n.mu.Lock()
	w := n.regions[region]
	addr := addrs[w.turn%len(addrs)]
	w.turn++
	w.tried = true
	n.mu.Unlock()

	pctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	start := time.Now()
	c, err := n.dial(pctx, addr)
	rtt := time.Since(start)
	if err != nil {
		if ce := n.logger.Check(zap.DebugLevel, "region round trip not measured"); ce != nil {
			ce.Write(zap.String("region", region), zap.String("addr", addr), zap.Error(err))
		}
		return
	}
	_ = c.Close()
	n.mu.Lock()
	w.add(max(rtt, time.Nanosecond))
	n.mu.Unlock()
}

// reorder computes the order of regions (every known one but home) from
// the medians, keeping the previous order between regions whose round
// trips are close, and publishes it with a new version if it changed.
func (n *regionRTT) reorder(known []string, home string) {
	rtt := n.snapshot()
	var prev []string
	var version uint64
	if o := n.order.Load(); o != nil {
		prev, version = o.regions, o.version
	}
	order := rankRegions(known, home, rtt, prev)
	if slices.Equal(order, prev) && n.order.Load() != nil {
		return
	}
	n.order.Store(&nearestOrder{regions: order, version: version + 1})
	if len(order) > 0 {
		n.logger.Info("nearest regions", zap.Strings("order", order), zap.Any("rtt", rttMillis(rtt)))
	}
}

// rankRegions orders regions other than home: measured ones (in rtt)
// nearest first, then the others by name. Measured regions start in
// their order in prev (new ones after, by round trip) and a region moves
// ahead of another only when significantly nearer, so that jitter
// between regions about as far away keeps the order.
func rankRegions(regions []string, home string, rtt map[string]time.Duration, prev []string) []string {
	var measured, unmeasured []string
	for _, r := range regions {
		switch {
		case r == home:
		case rtt[r] > 0:
			measured = append(measured, r)
		default:
			unmeasured = append(unmeasured, r)
		}
	}
	pos := func(r string) int {
		if i := slices.Index(prev, r); i >= 0 {
			return i
		}
		return len(prev)
	}
	sort.Slice(measured, func(i, j int) bool {
		a, b := measured[i], measured[j]
		if pa, pb := pos(a), pos(b); pa != pb {
			return pa < pb
		}
		if rtt[a] != rtt[b] {
			return rtt[a] < rtt[b]
		}
		return a < b
	})
	// An insertion sort under "significantly nearer": it stops where no
	// region is significantly nearer than the one before it.
	for i := 1; i < len(measured); i++ {
		for j := i; j > 0 && significantlyNearer(rtt[measured[j]], rtt[measured[j-1]]); j-- {
			measured[j], measured[j-1] = measured[j-1], measured[j]
		}
	}
	sort.Strings(unmeasured)
	return append(measured, unmeasured...)
}

// significantlyNearer reports whether a round trip of a is nearer than
// one of b by more than jitter: a tenth of b, at least a millisecond.
func significantlyNearer(a, b time.Duration) bool {
	return a+max(b/10, time.Millisecond) < b
}

// rttMillis is rtt in milliseconds, as the admin API shows it.
func rttMillis(rtt map[string]time.Duration) map[string]float64 {
	out := make(map[string]float64, len(rtt))
	for r, d := range rtt {
		out[r] = float64(d.Microseconds()) / 1000
	}
	return out
}

// regionRTTCollector exports the measured round trips on /metrics.
type regionRTTCollector struct{ n *regionRTT }

var descRegionRTT = prometheus.NewDesc("edgeplane_gateway_region_rtt_seconds",
	"Round trip from this gateway to a region: the median of its last TCP connect times.", []string{"region"}, nil)

func (c regionRTTCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descRegionRTT }

func (c regionRTTCollector) Collect(ch chan<- prometheus.Metric) {
	for r, d := range c.n.snapshot() {
		ch <- prometheus.MustNewConstMetric(descRegionRTT, prometheus.GaugeValue, d.Seconds(), r)
	}
}
