package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// loadRun drives GETs at url with Host host from workers for d and returns
// requests per second and latency percentiles. Any failure aborts.
func loadRun(b *testing.B, client *http.Client, url, host string, workers int, d time.Duration) (rps float64, p50, p99 time.Duration, cpuPerReq time.Duration) {
	b.Helper()
	cpu0 := processCPU(b)
	var mu sync.Mutex
	var lats []time.Duration
	var failed error
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Host = host
				t0 := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if failed != nil {
		b.Fatalf("load against %s: %v", url, failed)
	}
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpu0
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	return float64(len(lats)) / elapsed.Seconds(), lats[len(lats)/2], lats[len(lats)*99/100], cpu / time.Duration(len(lats))
}

// alternate runs a then b in even rounds, b then a in odd ones, so that
// drift in the machine's load (other processes) falls on both alike.
func alternate(round int, a, b func()) {
	if round%2 == 0 {
		a()
		b()
		return
	}
	b()
	a()
}

// processCPU is the CPU time this process used so far (user and system).
// The load generator, the backends and both servers share the process, so
// a per-request figure from it counts the client's and the backend's work
// too, the same on both sides of a comparison.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGatewayVsReverseProxy runs the edgeplane gateway and a stock
// Caddy reverse_proxy with the same static upstreams side by side in one
// Caddy, alternating rounds of identical load, and reports the gateway's
// req/s and p99 as ratios to the stock proxy's. It fails when the
// gateway's process CPU per request is above stock Caddy's over the
// median of its rounds (EDGEPLANE_GATEWAY_CPU_RATIO_MAX moves the limit
// from 1.0). Run with -benchtime=1x, under the bench lock.
func BenchmarkGatewayVsReverseProxy(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	seq := f.deploy("bench", map[string]storetest.Service{"web": svc([]string{"bench.test"}, nil, b1, b2)})
	stock := freeAddr(b)
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": f.natsURL, "snapshot_path": f.snap},
			"http": map[string]any{"servers": map[string]any{
				"gateway": map[string]any{"listen": []string{f.gateway}, "automatic_https": map[string]any{"disable": true},
					"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "edgeplane"}}}}},
				"stock": map[string]any{"listen": []string{stock}, "automatic_https": map[string]any{"disable": true},
					"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "reverse_proxy",
						"upstreams": []any{map[string]any{"dial": b1.srv.Listener.Addr().String()}, map[string]any{"dial": b2.srv.Listener.Addr().String()}}}}}}},
			}},
		},
	}
	raw, _ := json.Marshal(cfg)
	loadCaddy(b, raw)
	f.waitSeq(seq)

	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	gwURL, stURL := "http://"+f.gateway+"/", "http://"+stock+"/"
	loadRun(b, client, gwURL, "bench.test", workers, 300*time.Millisecond) // warm up both
	loadRun(b, client, stURL, "bench.test", workers, 300*time.Millisecond)
	b.ResetTimer()
	// Rounds alternate which side goes first, so drift in the machine's
	// load (other processes) falls on both alike; the figures are medians
	// of per-round ratios.
	var rpsRatios, p99Ratios, cpuRatios []float64
	var gwRPS, stRPS float64
	var gwP99s, stP99s []float64
	for i := 0; i < rounds; i++ {
		var gr, sr float64
		var gp, sp, gc, sc time.Duration
		alternate(i, func() { sr, _, sp, sc = loadRun(b, client, stURL, "bench.test", workers, round) },
			func() { gr, _, gp, gc = loadRun(b, client, gwURL, "bench.test", workers, round) })
		gwRPS, stRPS = gwRPS+gr, stRPS+sr
		rpsRatios = append(rpsRatios, gr/sr)
		cpuRatios = append(cpuRatios, float64(gc)/float64(sc))
		p99Ratios = append(p99Ratios, float64(sp)/float64(gp))
		gwP99s = append(gwP99s, float64(gp.Microseconds())/1000)
		stP99s = append(stP99s, float64(sp.Microseconds())/1000)
	}
	med := func(xs []float64) float64 {
		sort.Float64s(xs)
		return (xs[(len(xs)-1)/2] + xs[len(xs)/2]) / 2
	}
	rpsRatio, cpuRatio, p99Ratio := med(rpsRatios), med(cpuRatios), med(p99Ratios)
	b.ReportMetric(gwRPS/rounds, "gateway-req/s")
	b.ReportMetric(stRPS/rounds, "stock-req/s")
	b.ReportMetric(rpsRatio, "rps-ratio")
	b.ReportMetric(cpuRatio, "cpu-per-req-ratio(gw/stock)")
	b.ReportMetric(med(gwP99s), "gateway-p99-ms")
	b.ReportMetric(med(stP99s), "stock-p99-ms")
	b.ReportMetric(p99Ratio, "p99-ratio(stock/gw)")
	// Loud: the gateway must cost no more CPU per request than the server
	// it is built on. CPU per request is the figure a busy box leaves
	// standing (req/s and p99 move with whatever else runs).
	if limit := cpuRatioLimit(b); cpuRatio > limit {
		b.Fatalf("the gateway costs %.3fx stock Caddy's CPU per request (median of %d rounds: %s), above %.3f; req/s %.3fx, p99 %.3fx stock's (%s=%s)",
			cpuRatio, rounds, fmtRatios(cpuRatios), limit, rpsRatio, 1/p99Ratio, envCPURatioMax, os.Getenv(envCPURatioMax))
	}
}

// envCPURatioMax overrides the CPU-per-request ratio (gateway / stock
// Caddy) above which BenchmarkGatewayVsReverseProxy fails; default 1.0.
const envCPURatioMax = "EDGEPLANE_GATEWAY_CPU_RATIO_MAX"

// cpuRatioLimit is the ratio BenchmarkGatewayVsReverseProxy fails above.
func cpuRatioLimit(b *testing.B) float64 {
	v := os.Getenv(envCPURatioMax)
	if v == "" {
		return 1.0
	}
	limit, err := strconv.ParseFloat(v, 64)
	if err != nil || limit <= 0 {
		b.Fatalf("%s=%q: want a positive number", envCPURatioMax, v)
	}
	return limit
}

// fmtRatios lists ratios with three decimals.
func fmtRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 3, 64)
	}
	return strings.Join(parts, " ")
}

// BenchmarkRoutePolicy compares, through one gateway to the same
// backends, a route with every policy field a plain-HTTP request can use
// (strip_prefix, request and response headers, max_request_body, both
// timeouts, retries on 503) against a route without policy, in alternating
// rounds of identical load, and reports the req/s ratio (goal >= 0.95).
// redirect_https is left out: it answers plain HTTP without proxying. Run
// with -benchtime=1x.
func BenchmarkRoutePolicy(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.load()
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/plain"}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/policy"}, StripPrefix: true,
				RequestHeaders:  &store.HeaderOps{Set: map[string]string{"X-Env": "prod"}, Delete: []string{"X-Debug"}},
				ResponseHeaders: &store.HeaderOps{Set: map[string]string{"X-Frame-Options": "DENY"}, Delete: []string{"Server"}},
				MaxRequestBody:  "1MB",
				Timeouts:        &store.RouteTimeouts{Connect: store.Duration(2 * time.Second), ResponseHeader: store.Duration(10 * time.Second)},
				Retries:         &store.RouteRetries{OnStatus: []int{503}, Max: 1}},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	plain, policy := "http://"+f.gateway+"/plain", "http://"+f.gateway+"/policy/x"
	loadRun(b, client, plain, "bench.test", workers, 300*time.Millisecond)
	loadRun(b, client, policy, "bench.test", workers, 300*time.Millisecond)
	b.ResetTimer()
	var ratios []float64
	var plainRPS, policyRPS float64
	for i := 0; i < rounds; i++ {
		var pr, qr float64
		alternate(i, func() { pr, _, _, _ = loadRun(b, client, plain, "bench.test", workers, round) },
			func() { qr, _, _, _ = loadRun(b, client, policy, "bench.test", workers, round) })
		plainRPS, policyRPS = plainRPS+pr, policyRPS+qr
		ratios = append(ratios, qr/pr)
	}
	sort.Float64s(ratios)
	b.ReportMetric(plainRPS/rounds, "plain-req/s")
	b.ReportMetric(policyRPS/rounds, "policy-req/s")
	b.ReportMetric((ratios[(rounds-1)/2]+ratios[rounds/2])/2, "rps-ratio(policy/plain)")
}

// BenchmarkLocality compares, in one process against the same backends,
// the gateway serving with locality on (its region set, another region's
// instances in the view) and off (the same view, the gateway without a
// region), in alternating rounds of identical load, the config reloaded
// between them (the projection is kept), and reports the req/s ratio
// (goal >= 0.98): for a service whose every endpoint is at home (the
// fast path), and for one with an endpoint in another region too (the
// tiers path: home's two endpoints chosen per request). Run with
// -benchtime=1x.
func BenchmarkLocality(b *testing.B) {
	f := newFixture(b)
	b1, b2, far := newBackend(b, "b1"), newBackend(b, "b2"), newBackend(b, "far")
	f.publishRegional("bench", "mixed", "mixed.test", nil, nil, inRegion(b1, "tyo"), inRegion(b2, "tyo"), inRegion(far, "fra"))
	seq := f.publishRegional("bench", "web", "bench.test", nil, nil, inRegion(b1, "tyo"), inRegion(b2, "tyo"))
	on := func() { f.app = map[string]any{"region": "tyo"}; f.load() }
	off := func() { f.app = nil; f.load() }
	on()
	f.waitSeq(seq)
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	url := "http://" + f.gateway + "/"
	run := func(config func(), host string) (rps float64, cpu time.Duration) {
		config()
		loadRun(b, client, url, host, workers, 200*time.Millisecond) // warm up after the reload
		rps, _, _, cpu = loadRun(b, client, url, host, workers, round)
		return rps, cpu
	}
	med := func(xs []float64) float64 {
		sort.Float64s(xs)
		return (xs[(len(xs)-1)/2] + xs[len(xs)/2]) / 2
	}
	b.ResetTimer()
	for _, host := range []string{"bench.test", "mixed.test"} {
		var ratios, cpuRatios []float64
		var onRPS, offRPS float64
		for i := 0; i < rounds; i++ {
			var or, fr float64
			var oc, fc time.Duration
			alternate(i, func() { or, oc = run(on, host) }, func() { fr, fc = run(off, host) })
			onRPS, offRPS = onRPS+or, offRPS+fr
			ratios = append(ratios, or/fr)
			cpuRatios = append(cpuRatios, float64(oc)/float64(fc))
		}
		name := strings.TrimSuffix(host, ".test")
		b.ReportMetric(onRPS/rounds, name+"-on-req/s")
		b.ReportMetric(offRPS/rounds, name+"-off-req/s")
		b.ReportMetric(med(ratios), name+"-rps-ratio(on/off)")
		b.ReportMetric(med(cpuRatios), name+"-cpu-per-req-ratio(on/off)")
	}
}

// BenchmarkUpstreamsByLocality is the upstream source's own cost per
// request (no network), with the gateway's region set (on) and not
// (off), for a service whose endpoints are all in the gateway's region
// (web) and for one with an endpoint in another region too (mixed).
func BenchmarkUpstreamsByLocality(b *testing.B) {
	f := newFixture(b)
	b1, b2, far := newBackend(b, "b1"), newBackend(b, "b2"), newBackend(b, "far")
	f.publishRegional("bench", "mixed", "mixed.test", nil, nil, inRegion(b1, "tyo"), inRegion(b2, "tyo"), inRegion(far, "fra"))
	seq := f.publishRegional("bench", "web", "web.test", nil, nil, inRegion(b1, "tyo"), inRegion(b2, "tyo"))
	for _, mode := range []struct {
		name string
		app  map[string]any
		want map[string]int
	}{
		{"on", map[string]any{"region": "tyo"}, map[string]int{"web": 2, "mixed": 2}},
		{"off", nil, map[string]int{"web": 2, "mixed": 3}},
	} {
		f.app = mode.app
		f.load()
		f.waitSeq(seq)
		u := &Upstreams{app: current.Load()}
		for _, svc := range []string{"web", "mixed"} {
			b.Run(mode.name+"/"+svc, func(b *testing.B) {
				r := httptest.NewRequest(http.MethodGet, "http://"+svc+".test/", nil)
				b.ReportAllocs()
				for b.Loop() {
					if ups, _ := u.GetUpstreams(r); len(ups) != mode.want[svc] {
						b.Fatalf("%d upstreams, want %d", len(ups), mode.want[svc])
					}
				}
			})
		}
	}
}
