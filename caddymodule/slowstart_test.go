package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestRampFraction(t *testing.T) {
	w := 10 * time.Second
	cases := []struct {
		age, window time.Duration
		want        float64
	}{
		{0, w, rampFloor},
		{-time.Second, w, rampFloor},
		{w / 2, w, rampFloor + (1-rampFloor)/2},
		{w / 4, w, rampFloor + (1-rampFloor)/4},
		{w - time.Millisecond, w, 1 - (1-rampFloor)*float64(time.Millisecond)/float64(w)},
		{w, w, 1},
		{2 * w, w, 1},
		{time.Second, 0, 1},
	}
	for _, c := range cases {
		if got := rampFraction(c.age, c.window); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("rampFraction(%s, %s) = %v, want %v", c.age, c.window, got, c.want)
		}
	}
}

// viewOf is a view loaded from the store (not stale) of services on one
// machine at 10.0.0.1: each service's instances by ID, each at port
// 8000+n where n is the number after the ID's last dash.
func viewOf(t testing.TB, slowStart time.Duration, services map[string][]string) *projection.View {
	t.Helper()
	rs := &store.RoutingState{Seq: 1, Machines: []store.MachineRecord{{Version: 1, ID: "m1", State: store.MachineActive, Address: "10.0.0.1"}}}
	for name, ids := range services {
		ev := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "ns", Service: name, SlowStart: store.Duration(slowStart)}
		for _, id := range ids {
			ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: id, Machine: "m1", Address: "10.0.0.1", Port: portOf(t, id)})
		}
		rs.Services = append(rs.Services, ev)
	}
	v, errs := projection.FromState(rs)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return v
}

func portOf(t testing.TB, id string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(id[len(id)-1:], "%d", &n); err != nil {
		t.Fatalf("instance %q: %v", id, err)
	}
	return 8000 + n
}

func dialOf(t testing.TB, id string) string {
	return net.JoinHostPort("10.0.0.1", strconv.Itoa(portOf(t, id)))
}

// rampingDials lists the dial addresses ramping now, sorted.
func rampingDials(s *slowStart) []string {
	rp := s.ramping.Load()
	if rp == nil {
		return nil
	}
	var out []string
	for d := range *rp {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

func TestSlowStartFirstSeen(t *testing.T) {
	s := newSlowStart()
	t0 := time.Now()
	win := 10 * time.Second

	// Before the first load (a stale, empty view: no snapshot, store not
	// reached), then the first load: what it holds is established.
	p, err := projection.New(projection.Config{Connect: func(context.Context) (*store.Store, error) { return nil, errors.New("not reached") }})
	if err != nil {
		t.Fatal(err)
	}
	if !p.View().Stale {
		t.Fatal("a projection that never loaded serves a view not stale")
	}
	s.observe(p.View(), t0)
	if next := s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2"}}), t0); !next.IsZero() || rampingDials(s) != nil {
		t.Fatalf("the first load ramps %v (next %v)", rampingDials(s), next)
	}

	// An instance new to its service ramps from when it was seen; a new
	// service's instances do not.
	t1 := t0.Add(time.Second)
	next := s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3"}, "api": {"api-4", "api-5"}}), t1)
	if got, want := rampingDials(s), []string{dialOf(t, "web-3")}; !slices.Equal(got, want) {
		t.Fatalf("ramping %v, want %v", got, want)
	}
	if !next.Equal(t1.Add(win)) {
		t.Errorf("next ramp end %v, want %v", next, t1.Add(win))
	}
	if r := (*s.ramping.Load())[dialOf(t, "web-3")]; !r.since.Equal(t1) || r.window != win {
		t.Errorf("web-3 ramps since %v over %s, want since %v over %s", r.since, r.window, t1, win)
	}

	// A later view keeps the first-seen time; another new instance ramps
	// from its own.
	t2 := t1.Add(3 * time.Second)
	s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6"}, "api": {"api-4", "api-5"}}), t2)
	rp := *s.ramping.Load()
	if len(rp) != 2 || !rp[dialOf(t, "web-3")].since.Equal(t1) || !rp[dialOf(t, "web-6")].since.Equal(t2) {
		t.Fatalf("ramping %v, want web-3 since %v and web-6 since %v", rp, t1, t2)
	}

	// An instance that leaves is forgotten: back, it ramps anew.
	t3 := t2.Add(time.Second)
	s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-6"}, "api": {"api-4", "api-5"}}), t3)
	if got, want := rampingDials(s), []string{dialOf(t, "web-6")}; !slices.Equal(got, want) {
		t.Fatalf("after web-3 left, ramping %v, want %v", got, want)
	}
	t4 := t3.Add(time.Second)
	s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6"}, "api": {"api-4", "api-5"}}), t4)
	if r := (*s.ramping.Load())[dialOf(t, "web-3")]; !r.since.Equal(t4) {
		t.Errorf("web-3 back ramps since %v, want %v", r.since, t4)
	}

	// Windows end: web-6's first, then web-3's; then nothing ramps and
	// thin's check is the nil pointer.
	next = s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6"}, "api": {"api-4", "api-5"}}), t2.Add(win))
	if got, want := rampingDials(s), []string{dialOf(t, "web-3")}; !slices.Equal(got, want) || !next.Equal(t4.Add(win)) {
		t.Fatalf("at web-6's window end, ramping %v (next %v), want %v (next %v)", got, next, want, t4.Add(win))
	}
	if next := s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6"}}), t4.Add(win)); !next.IsZero() || s.ramping.Load() != nil {
		t.Fatalf("after every window, ramping %v (next %v)", rampingDials(s), next)
	}

	// A service without slow start ramps nothing.
	s.observe(viewOf(t, 0, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6", "web-7"}}), t4.Add(win+time.Second))
	if got := rampingDials(s); got != nil {
		t.Errorf("without slow start, ramping %v", got)
	}
}

func TestThin(t *testing.T) {
	s := newSlowStart()
	win := 10 * time.Second
	now := time.Now()
	s.observe(viewOf(t, win, map[string][]string{"web": {"web-1", "web-2"}, "api": {"api-4", "api-5"}}), now)
	v := viewOf(t, win, map[string][]string{"web": {"web-1", "web-2", "web-3"}, "api": {"api-4", "api-5"}})
	web, _ := v.Service("ns", "web")
	api, _ := v.Service("ns", "api")
	webDials := []string{dialOf(t, "web-1"), dialOf(t, "web-2"), dialOf(t, "web-3")}
	apiDials := []string{dialOf(t, "api-4"), dialOf(t, "api-5")}

	// Nothing ramps: the same slice back, no allocation.
	if n := testing.AllocsPerRun(1000, func() { _ = s.thin(web, webDials) }); n != 0 {
		t.Errorf("thin with nothing ramping allocates %v times", n)
	}
	if got := s.thin(web, webDials); &got[0] != &webDials[0] {
		t.Error("thin with nothing ramping copied the list")
	}

	// web-3 ramps from its floor (seen now).
	s.observe(v, time.Now())
	if n := testing.AllocsPerRun(1000, func() { _ = s.thin(api, apiDials) }); n != 0 {
		t.Errorf("thin of a service with nothing ramping allocates %v times", n)
	}
	var nilStart *slowStart
	if got := nilStart.thin(web, webDials); len(got) != 3 || nilStart.rampingNow() != nil {
		t.Errorf("a nil slowStart thinned to %v", got)
	}
	if got := s.rampingNow(); len(got) != 1 || got[dialOf(t, "web-3")] < rampFloor || got[dialOf(t, "web-3")] > rampFloor+0.01 {
		t.Errorf("rampingNow = %v, want web-3 at about %v", got, rampFloor)
	}

	const runs = 20000
	kept := 0
	for range runs {
		got := s.thin(web, webDials)
		switch {
		case len(got) == 3:
			kept++
		case len(got) != 2 || got[0] != webDials[0] || got[1] != webDials[1]:
			t.Fatalf("thin -> %v, want web-1 and web-2 with or without web-3", got)
		}
	}
	if share := float64(kept) / runs; math.Abs(share-rampFloor) > 0.02 {
		t.Errorf("web-3 at the start of its ramp kept in %.3f of lists, want about %.2f", share, rampFloor)
	}

	// Never empty: a list of ramping endpoints only comes back whole
	// when every one was dropped.
	only := []string{dialOf(t, "web-3"), dialOf(t, "web-3")}
	for range 1000 {
		if got := s.thin(web, only); len(got) == 0 {
			t.Fatal("thin emptied a list")
		}
	}
	// A one-endpoint list and a service without slow start are left alone.
	if got := s.thin(web, webDials[2:]); len(got) != 1 {
		t.Errorf("thin of one endpoint -> %v", got)
	}
	off := viewOf(t, 0, map[string][]string{"web": {"web-1", "web-2", "web-3"}})
	webOff, _ := off.Service("ns", "web")
	for range 100 {
		if got := s.thin(webOff, webDials); len(got) != 3 {
			t.Fatalf("thin of a service without slow start -> %v", got)
		}
	}
}

// The share a new instance gets over its ramp, measured at a real
// gateway: two established instances and a third added with a 4 s slow
// start; requests from four clients. Under random selection its share in
// each second of the ramp is about (floor + (1-floor)·t/4)/3, then 1/3;
// least_conn gives it a little more (it prefers the instance thinning
// left idle whenever it is a candidate).
func TestGatewaySlowStartShare(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a 4 s ramp")
	}
	for _, policy := range []string{"random", "least_conn"} {
		t.Run(policy, func(t *testing.T) { testSlowStartShare(t, policy) })
	}
}

func testSlowStartShare(t *testing.T, policy string) {
	const window = 4 * time.Second
	f := newFixture(t)
	f.handler = map[string]any{"load_balancing": map[string]any{"selection_policy": map[string]any{"policy": policy}}}
	bs := []*backend{newBackend(t, "web-1"), newBackend(t, "web-2"), newBackend(t, "web-3")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := storetest.AdmitMachine(ctx, f.nats.Store, "m1", bs[0].host); err != nil {
		t.Fatal(err)
	}
	publish := func(bs ...*backend) uint64 {
		t.Helper()
		seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{slowStartUpsert(window, bs...)})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	f.load()
	f.waitSeq(publish(bs[0], bs[1]))
	if r := f.mustGet("shop.test", "/"); r.status != http.StatusOK {
		t.Fatalf("before the new instance: %d %q", r.status, r.body)
	}

	f.waitSeq(publish(bs...))
	// The ramp starts when the gateway took the view in.
	slow := current.Load().shared.slow
	var since time.Time
	storetest.Eventually(t, wait, "web-3 to ramp", func() bool {
		if rp := slow.ramping.Load(); rp != nil {
			since = (*rp)[net.JoinHostPort(bs[2].host, strconv.Itoa(bs[2].port))].since
		}
		return !since.IsZero()
	})

	const seconds = 5 // the window's four seconds, and one after
	var mu sync.Mutex
	var total, fresh [seconds]int
	var wg sync.WaitGroup
	var failed error
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := f.get("shop.test", "/")
				at := time.Since(since)
				k := int(at / time.Second)
				mu.Lock()
				if err != nil || r.status != http.StatusOK {
					failed = fmt.Errorf("GET -> %d %q %v", r.status, r.body, err)
				}
				if k < seconds && err == nil {
					total[k]++
					if r.backend == "web-3" {
						fresh[k]++
					}
				}
				mu.Unlock()
				if k >= seconds || failed != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	var shares [seconds]float64
	for k := range seconds {
		if total[k] < 100 {
			t.Fatalf("only %d requests in second %d of the ramp: too few to measure a share", total[k], k)
		}
		shares[k] = float64(fresh[k]) / float64(total[k])
		mid := time.Duration(k)*time.Second + time.Second/2
		t.Logf("second %d: web-3 served %d of %d requests (%.3f; expected %.3f)",
			k, fresh[k], total[k], shares[k], rampFraction(mid, window)/3)
	}
	full := 1.0 / 3
	if shares[0] > 0.6*full {
		t.Errorf("first second of the ramp: share %.3f, want well below a full share (%.3f)", shares[0], full)
	}
	// Within the ramp it only grows (least_conn may overshoot a full
	// share by its end: the instance is still the least loaded).
	for k := 1; k < 4; k++ {
		if shares[k] < shares[k-1]-0.05 {
			t.Errorf("share fell from %.3f to %.3f in second %d of the ramp", shares[k-1], shares[k], k)
		}
	}
	if shares[3] < 0.65*full {
		t.Errorf("last second of the ramp: share %.3f, want near a full share (%.3f)", shares[3], full)
	}
	if math.Abs(shares[4]-full) > 0.08 {
		t.Errorf("after the ramp: share %.3f, want a full share (%.3f)", shares[4], full)
	}
}

// A gateway restarted while an instance ramps ramps nothing at start:
// its snapshot's endpoints and its first load's are established (an
// instance that came while it was down too); a config reload keeps a
// ramp as it was.
func TestGatewaySlowStartAcrossReloadAndRestart(t *testing.T) {
	f := newFixture(t)
	bs := []*backend{newBackend(t, "web-1"), newBackend(t, "web-2"), newBackend(t, "web-3"), newBackend(t, "web-4"), newBackend(t, "web-5")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := storetest.AdmitMachine(ctx, f.nats.Store, "m1", bs[0].host); err != nil {
		t.Fatal(err)
	}
	publish := func(bs ...*backend) uint64 {
		t.Helper()
		seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{slowStartUpsert(time.Minute, bs...)})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	dial := func(b *backend) string { return net.JoinHostPort(b.host, strconv.Itoa(b.port)) }
	slow := func() *slowStart { return current.Load().shared.slow }

	f.load()
	f.waitSeq(publish(bs[:2]...))
	seq := publish(bs[:3]...)
	f.waitSeq(seq)
	storetest.Eventually(t, wait, "web-3 to ramp", func() bool { return slices.Equal(rampingDials(slow()), []string{dial(bs[2])}) })
	since := (*slow().ramping.Load())[dial(bs[2])].since
	_, body := f.adminGet("/edgeplane/routes")
	var routes []RouteInfo
	if err := json.Unmarshal(body, &routes); err != nil || len(routes) != 1 || len(routes[0].SlowStart) != 1 ||
		routes[0].SlowStart["web-3"] < rampFloor || routes[0].SlowStart["web-3"] > 0.2 {
		t.Errorf("/edgeplane/routes does not show web-3 ramping: %s", body)
	}

	f.handler = map[string]any{"load_balancing": map[string]any{"retries": 1}}
	f.load()
	if r := (*slow().ramping.Load())[dial(bs[2])]; !r.since.Equal(since) {
		t.Fatalf("after a config reload web-3 ramps since %v, want %v", r.since, since)
	}

	storetest.Eventually(t, wait, "snapshot written", func() bool {
		st := f.proj().Status()
		return st.SnapshotError == "" && fileExists(f.snap) && st.AppliedSeq >= seq
	})
	time.Sleep(1500 * time.Millisecond) // the snapshot of seq, not an earlier one
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	// web-4 comes while the gateway is down.
	seq = publish(bs[:4]...)
	f.load()
	f.waitSeq(seq)
	if got := rampingDials(slow()); got != nil {
		t.Fatalf("a restarted gateway ramps %v", got)
	}
	f.waitSeq(publish(bs...))
	storetest.Eventually(t, wait, "web-5 to ramp after the restart", func() bool { return slices.Equal(rampingDials(slow()), []string{dial(bs[4])}) })
}

// slowStartUpsert is the upsert of shop/web, routed for shop.test, with
// bs as its endpoints (on machine m1) and slow start over window.
func slowStartUpsert(window time.Duration, bs ...*backend) store.RoutingEvent {
	ev := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		DeployID: "d1", Revision: 1, Routes: []store.Route{{Hosts: []string{"shop.test"}}}, SlowStart: store.Duration(window), At: time.Now().UTC()}
	for i, b := range bs {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: b.name, Machine: "m1", Slot: i, Revision: 1, Address: b.host, Port: b.port})
	}
	return ev
}

// BenchmarkThin is thin's cost per request: nothing ramping anywhere
// (the common case), something ramping in another service, and one of
// the service's three endpoints ramping.
func BenchmarkThin(b *testing.B) {
	t := b
	s := newSlowStart()
	now := time.Now()
	s.observe(viewOf(t, time.Minute, map[string][]string{"web": {"web-1", "web-2", "web-3"}, "api": {"api-4"}}), now)
	v := viewOf(t, time.Minute, map[string][]string{"web": {"web-1", "web-2", "web-3"}, "api": {"api-4", "api-5"}})
	web, _ := v.Service("ns", "web")
	dials := []string{dialOf(t, "web-1"), dialOf(t, "web-2"), dialOf(t, "web-3")}
	b.Run("nothing-ramping", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.thin(web, dials)
		}
	})
	s.observe(v, now)
	b.Run("other-service-ramping", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.thin(web, dials)
		}
	})
	s.observe(viewOf(t, time.Minute, map[string][]string{"web": {"web-1", "web-2", "web-3", "web-6"}, "api": {"api-4", "api-5"}}), now)
	dials = append(dials, dialOf(t, "web-6"))
	b.Run("one-of-four-ramping", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.thin(web, dials)
		}
	})
}
