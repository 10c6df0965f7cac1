package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestRTTWindowMedian(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		samples []time.Duration
		want    time.Duration
	}{
		{nil, 0},
		{[]time.Duration{30 * ms}, 30 * ms},
		{[]time.Duration{30 * ms, 40 * ms}, 35 * ms},
		// One slow handshake does not move it.
		{[]time.Duration{30 * ms, 900 * ms, 31 * ms}, 31 * ms},
		// Only the last rttSamples count.
		{[]time.Duration{900 * ms, 900 * ms, 900 * ms, 900 * ms, 30 * ms, 31 * ms, 32 * ms, 33 * ms, 34 * ms}, 32 * ms},
	}
	for _, c := range cases {
		var w rttWindow
		for _, s := range c.samples {
			w.add(s)
		}
		if got := w.median(); got != c.want {
			t.Errorf("median of %v = %s, want %s", c.samples, got, c.want)
		}
	}
}

func TestRankRegions(t *testing.T) {
	ms := time.Millisecond
	regions := []string{"ams", "fra", "nyc", "sgp", "tyo"}
	cases := []struct {
		name string
		home string
		rtt  map[string]time.Duration
		prev []string
		want []string
	}{
		{"nothing measured: by name, home left out", "tyo", nil, nil, []string{"ams", "fra", "nyc", "sgp"}},
		{"measured nearest first, then the others by name", "tyo", map[string]time.Duration{"nyc": 60 * ms, "fra": 30 * ms},
			nil, []string{"fra", "nyc", "ams", "sgp"}},
		{"no home: every region", "", map[string]time.Duration{"tyo": 5 * ms},
			nil, []string{"tyo", "ams", "fra", "nyc", "sgp"}},
		{"jitter keeps the previous order", "tyo", map[string]time.Duration{"nyc": 30 * ms, "fra": 31 * ms},
			[]string{"fra", "nyc"}, []string{"fra", "nyc", "ams", "sgp"}},
		{"within a millisecond keeps it too", "tyo", map[string]time.Duration{"nyc": 2 * ms, "fra": 2*ms + 900*time.Microsecond},
			[]string{"fra", "nyc"}, []string{"fra", "nyc", "ams", "sgp"}},
		{"a real change reorders", "tyo", map[string]time.Duration{"nyc": 30 * ms, "fra": 80 * ms},
			[]string{"fra", "nyc"}, []string{"nyc", "fra", "ams", "sgp"}},
		{"a new region goes where it belongs", "tyo", map[string]time.Duration{"nyc": 60 * ms, "fra": 30 * ms, "sgp": 10 * ms},
			[]string{"fra", "nyc", "ams", "sgp"}, []string{"sgp", "fra", "nyc", "ams"}},
		{"a new region about as far stays behind", "tyo", map[string]time.Duration{"nyc": 60 * ms, "fra": 30 * ms, "sgp": 29 * ms},
			[]string{"fra", "nyc"}, []string{"fra", "sgp", "nyc", "ams"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := rankRegions(regions, c.home, c.rtt, c.prev); !slices.Equal(got, c.want) {
				t.Errorf("rankRegions = %v, want %v", got, c.want)
			}
		})
	}
}

// regionLab is a view of machines in regions, each with one service
// endpoint on a real loopback listener, and a dialer that adds each
// region's distance (loopback has none) before the real connect.
type regionLab struct {
	t     *testing.T
	mu    sync.Mutex
	delay map[string]time.Duration // by listener address
	dials map[string]int
	view  atomic.Pointer[projection.View]
	// swapped is closed at the next view swap.
	swapMu  sync.Mutex
	swapped chan struct{}
	addrs   map[string][]string // listener addresses by region
}

func newRegionLab(t *testing.T) *regionLab {
	return &regionLab{t: t, delay: map[string]time.Duration{}, dials: map[string]int{}, swapped: make(chan struct{}), addrs: map[string][]string{}}
}

// listen opens n listeners for region (accepting and closing), n >= 0.
func (l *regionLab) listen(region string, n int) {
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			l.t.Fatal(err)
		}
		l.t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		l.addrs[region] = append(l.addrs[region], ln.Addr().String())
	}
}

// setDelay sets the distance to region.
func (l *regionLab) setDelay(region string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.addrs[region] {
		l.delay[a] = d
	}
}

// publish swaps in a view of the lab's listeners: a machine per region
// (at 127.0.0.1) with the regions' listeners as endpoints of one service,
// and regions with no machine, known by a state only.
func (l *regionLab) publish(stateOnly ...string) {
	rs := &store.RoutingState{Seq: 1}
	ev := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "ns", Service: "web"}
	for region, addrs := range l.addrs {
		m := "m-" + region
		rs.Machines = append(rs.Machines, store.MachineRecord{Version: 1, ID: m, Region: region, State: store.MachineActive, Address: "127.0.0.1"})
		for i, a := range addrs {
			_, port, _ := net.SplitHostPort(a)
			p, _ := strconv.Atoi(port)
			ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: fmt.Sprintf("%s-%d", region, i), Machine: m, Address: "127.0.0.1", Port: p})
		}
	}
	rs.Services = append(rs.Services, ev)
	for _, r := range stateOnly {
		rs.Regions = append(rs.Regions, store.RegionRecord{Name: r, State: store.RegionActive})
	}
	v, errs := projection.FromState(rs)
	if len(errs) > 0 {
		l.t.Fatal(errs)
	}
	l.view.Store(v)
	l.swapMu.Lock()
	close(l.swapped)
	l.swapped = make(chan struct{})
	l.swapMu.Unlock()
}

func (l *regionLab) changed() <-chan struct{} {
	l.swapMu.Lock()
	defer l.swapMu.Unlock()
	return l.swapped
}

func (l *regionLab) rtt(interval time.Duration, home string) *regionRTT {
	n := newRegionRTT(interval, l.view.Load, l.changed, func() string { return home }, zap.NewNop())
	real := n.dial
	n.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		l.mu.Lock()
		d := l.delay[addr]
		l.dials[addr]++
		l.mu.Unlock()
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return real(ctx, addr)
	}
	return n
}

func TestRegionRTTMeasuresAndOrders(t *testing.T) {
	ms := time.Millisecond
	l := newRegionLab(t)
	l.listen("tyo", 1)
	l.listen("fra", 2)
	l.listen("nyc", 1)
	l.setDelay("fra", 30*ms)
	l.setDelay("nyc", 60*ms)
	l.publish("sgp")
	n := l.rtt(time.Hour, "tyo")
	ctx := context.Background()

	if order, version := n.nearest(); order != nil || version != 0 {
		t.Fatalf("before any round: %v (version %d)", order, version)
	}
	for range 3 {
		n.round(ctx, true)
	}
	rtt := n.snapshot()
	for r, d := range map[string]time.Duration{"fra": 30 * ms, "nyc": 60 * ms} {
		if rtt[r] < d || rtt[r] > d+20*ms {
			t.Errorf("%s measured at %s, want about %s", r, rtt[r], d)
		}
	}
	if _, ok := rtt["tyo"]; ok {
		t.Error("the gateway's own region was measured")
	}
	order, version := n.nearest()
	if want := []string{"fra", "nyc", "sgp"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v (rtt %v)", order, want, rtt)
	}
	// Each region's endpoints in turn.
	l.mu.Lock()
	for _, a := range l.addrs["fra"] {
		if l.dials[a] == 0 {
			t.Errorf("fra's endpoint %s never probed (%v)", a, l.dials)
		}
	}
	if d := l.dials[l.addrs["tyo"][0]]; d != 0 {
		t.Errorf("home's endpoint probed %d times", d)
	}
	l.mu.Unlock()

	// Rounds that change nothing keep the version.
	n.round(ctx, true)
	if o, v := n.nearest(); v != version || !slices.Equal(o, order) {
		t.Errorf("an unchanged round moved %v (%d) to %v (%d)", order, version, o, v)
	}

	// fra moves away: once most of its samples say so, nyc is nearer.
	l.setDelay("fra", 120*ms)
	for range 3 {
		n.round(ctx, true)
	}
	if o, v := n.nearest(); !slices.Equal(o, []string{"nyc", "fra", "sgp"}) || v != version+1 {
		t.Errorf("after fra moved away: %v (version %d), want [nyc fra sgp] (version %d); rtt %v", o, v, version+1, n.snapshot())
	}

	// A region whose endpoints refuse is not measured: it comes after
	// the measured ones, by name.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addrs["ams"] = []string{ln.Addr().String()}
	ln.Close()
	l.publish("sgp")
	for range 2 {
		n.round(ctx, true)
	}
	l.mu.Lock()
	refused := l.dials[l.addrs["ams"][0]]
	l.mu.Unlock()
	if _, ok := n.snapshot()["ams"]; ok || refused != 2 {
		t.Errorf("ams refusing (%d connects): measured %v", refused, n.snapshot())
	}
	if o, _ := n.nearest(); !slices.Equal(o, []string{"nyc", "fra", "ams", "sgp"}) {
		t.Errorf("with ams refusing: %v, want [nyc fra ams sgp]", o)
	}
}

// run probes a region as soon as a view shows it, without waiting for
// the interval, and stops with its context.
func TestRegionRTTRunFollowsViews(t *testing.T) {
	l := newRegionLab(t)
	l.listen("fra", 1)
	l.publish()
	n := l.rtt(time.Hour, "tyo")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.run(ctx)
	}()
	storetest.Eventually(t, wait, "fra measured", func() bool { _, ok := n.snapshot()["fra"]; return ok })
	l.listen("nyc", 1)
	l.publish()
	storetest.Eventually(t, wait, "nyc measured after it appeared", func() bool {
		o, _ := n.nearest()
		_, ok := n.snapshot()["nyc"]
		return ok && len(o) == 2
	})
	// A region gone from the view is forgotten.
	delete(l.addrs, "fra")
	l.publish()
	storetest.Eventually(t, wait, "fra forgotten", func() bool {
		o, _ := n.nearest()
		_, ok := n.snapshot()["fra"]
		return !ok && slices.Equal(o, []string{"nyc"})
	})
	cancel()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("run did not return when its context ended")
	}
	var disabled *regionRTT
	if o, v := disabled.nearest(); o != nil || v != 0 || disabled.snapshot() != nil {
		t.Error("a nil regionRTT answers")
	}
}

// The gateway measures the regions of its view and exports them on
// /metrics; region_probe_interval 0 turns it off.
func TestGatewayRegionRTTMetrics(t *testing.T) {
	f := newFixture(t)
	fra, nyc := newBackend(t, "web-fra"), newBackend(t, "web-nyc")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	var evs []store.RoutingEvent
	web := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		DeployID: "d1", Revision: 1, Routes: []store.Route{{Hosts: []string{"shop.test"}}}, At: now}
	for i, b := range []*backend{fra, nyc} {
		region := strings.TrimPrefix(b.name, "web-")
		m := &store.MachineRecord{Version: store.RecordVersion, ID: "m-" + region, Region: region, State: store.MachineActive,
			Address: b.host, JoinedAt: now, UpdatedAt: now}
		evs = append(evs, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: m, At: now})
		web.Endpoints = append(web.Endpoints, store.Endpoint{InstanceID: b.name, Machine: m.ID, Slot: i, Revision: 1, Address: b.host, Port: b.port})
	}
	seq, err := f.nats.Store.PublishRouting(ctx, "", append(evs, web))
	if err != nil {
		t.Fatal(err)
	}
	f.app = map[string]any{"region_probe_interval": int64(time.Second)}
	f.load()
	f.waitSeq(seq)
	storetest.Eventually(t, wait, "both regions measured", func() bool {
		o, _ := current.Load().rtt.nearest()
		return len(current.Load().rtt.snapshot()) == 2 && (slices.Equal(o, []string{"fra", "nyc"}) || slices.Equal(o, []string{"nyc", "fra"}))
	})
	_, body := f.adminGet("/edgeplane/projection")
	var st GatewayStatus
	if err := json.Unmarshal(body, &st); err != nil || st.RegionRTTMillis["fra"] <= 0 || st.RegionRTTMillis["nyc"] <= 0 {
		t.Errorf("/edgeplane/projection shows no round trips: %s", body)
	}
	_, body = f.adminGet("/metrics")
	for _, r := range []string{"fra", "nyc"} {
		if want := fmt.Sprintf("edgeplane_gateway_region_rtt_seconds{region=%q}", r); !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	f.app = map[string]any{"region_probe_interval": 0}
	f.load()
	if current.Load().rtt != nil {
		t.Error("region_probe_interval 0 still measures")
	}
	if _, body := f.adminGet("/metrics"); strings.Contains(string(body), "edgeplane_gateway_region_rtt_seconds") {
		t.Error("metrics show round trips with measuring off")
	}
}
