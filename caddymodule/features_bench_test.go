package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// gatewayFeature is one default feature of the request path the features
// bench turns off: by config (the app's settings, the server's listener
// wrapper, the host's service) or, where no config can, by featuresOff.
type gatewayFeature struct {
	name string
	// app overrides the all-on app config; noL4 drops the listener
	// wrapper; host is the service requested (default: the split one).
	app  map[string]any
	noL4 bool
	host string
	// off is the featuresOff switch of a feature no config turns off.
	off *atomic.Bool
}

// BenchmarkGatewayFeatures runs the gateway with every default feature on
// (health probes, the abandonment registration, traffic counting, access
// lines with request IDs, canary splitting, the layer-4 listener wrapper,
// locality with the gateway's region set), then with each feature off in
// turn, and a stock Caddy reverse_proxy to the same two backends, in one
// process, in rounds that run every side once in a rotating order, and
// prints per side the medians over rounds of req/s and process CPU per
// request as ratios to stock Caddy's in the same round, and allocations
// per request (process-wide: client and backends included, the same on
// every side). A feature's cost is the difference between "all" and its
// row. The route has no policy (a policy's cost: BenchmarkRoutePolicy).
// Run with -benchtime=1x, under the bench lock (about 80 s).
func BenchmarkGatewayFeatures(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.publishRegional("bench", "canary", "canary.test", nil, &store.Split{Deploy: "bench-canary", From: 1, Revision: 2, Weight: 10},
		inRegion(b1, "tyo"), regional{b: b2, region: "tyo", revised: true})
	seq := f.publishRegional("bench", "web", "web.test", nil, nil, inRegion(b1, "tyo"), inRegion(b2, "tyo"))
	stock := freeAddr(b)
	load := func(feat gatewayFeature) {
		app := map[string]any{"nats_url": f.natsURL, "snapshot_path": f.snap, "gateway_name": "gw-test", "region": "tyo",
			"layer4_bind": "127.0.0.1"}
		for k, v := range feat.app {
			app[k] = v
		}
		gw := map[string]any{"listen": []string{f.gateway}, "automatic_https": map[string]any{"disable": true},
			"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "edgeplane"}}}}}
		if !feat.noL4 {
			gw["listener_wrappers"] = []any{map[string]any{"wrapper": "layer4", "routes": []any{map[string]any{
				"match":  []any{map[string]any{"tls": map[string]any{"edgeplane_passthrough": map[string]any{}}}},
				"handle": []any{map[string]any{"handler": "edgeplane"}},
			}}}}
		}
		cfg := map[string]any{
			"admin":   map[string]any{"disabled": true},
			"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
			"apps": map[string]any{
				"edgeplane": app,
				"http": map[string]any{"servers": map[string]any{
					"gateway": gw,
					"stock": map[string]any{"listen": []string{stock}, "automatic_https": map[string]any{"disable": true},
						"routes": []any{map[string]any{"handle": []any{map[string]any{"handler": "reverse_proxy",
							"upstreams": []any{map[string]any{"dial": b1.srv.Listener.Addr().String()}, map[string]any{"dial": b2.srv.Listener.Addr().String()}}}}}}},
				}},
			},
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			b.Fatal(err)
		}
		loadCaddy(b, raw)
	}
	features := []gatewayFeature{
		{name: "all"},
		{name: "-health probes", app: map[string]any{"disable_health_checks": true}},
		{name: "-abandonment registration", off: &featuresOff.abandon},
		{name: "-traffic counting (+access line)", off: &featuresOff.traffic},
		{name: "-access lines", app: map[string]any{"disable_access_log": true}},
		{name: "-request IDs", off: &featuresOff.requestIDs},
		{name: "-canary split", host: "web.test"},
		{name: "-layer-4 wrapper", noL4: true, app: map[string]any{"disable_layer4": true}},
		{name: "-locality", off: &featuresOff.locality},
	}
	load(features[0])
	f.waitSeq(seq)

	const workers = 16
	rounds, round := 3, time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	measure := func(url, host string) (rps float64, cpu time.Duration, allocs float64) {
		client.CloseIdleConnections() // new connections meet the listener loaded
		loadRun(b, client, url, host, workers, 200*time.Millisecond)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		rps, _, _, cpu = loadRun(b, client, url, host, workers, round)
		runtime.ReadMemStats(&m1)
		return rps, cpu, float64(m1.Mallocs-m0.Mallocs) / (rps * round.Seconds())
	}
	type figures struct{ rps, cpu, allocs []float64 }
	got := make([]figures, len(features))
	var stockAllocs []float64
	gwURL, stURL := "http://"+f.gateway+"/", "http://"+stock+"/"
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		// Each round starts one further along the list, and each side
		// runs right beside a stock run of its own (first or second by
		// turns), so drift in the machine's load falls on both alike.
		for k := range features {
			i := (k + r) % len(features)
			feat := features[i]
			if feat.off != nil {
				feat.off.Store(true)
			}
			load(feat)
			host := "canary.test"
			if feat.host != "" {
				host = feat.host
			}
			var rps, stRPS, allocs, stAlloc float64
			var cpu, stCPU time.Duration
			alternate(r+k, func() { stRPS, stCPU, stAlloc = measure(stURL, "web.test") },
				func() { rps, cpu, allocs = measure(gwURL, host) })
			if feat.off != nil {
				feat.off.Store(false)
			}
			stockAllocs = append(stockAllocs, stAlloc)
			got[i].rps = append(got[i].rps, rps/stRPS)
			got[i].cpu = append(got[i].cpu, float64(cpu)/float64(stCPU))
			got[i].allocs = append(got[i].allocs, allocs)
		}
	}
	b.StopTimer()
	var out strings.Builder
	fmt.Fprintf(&out, "gateway features vs stock Caddy reverse_proxy, medians of %d rounds (spread min-max):\n", rounds)
	fmt.Fprintf(&out, "| %-34s | %-22s | %-22s | %-13s |\n", "gateway", "req/s ratio", "CPU/request ratio", "allocs/req")
	for i, feat := range features {
		g := got[i]
		fmt.Fprintf(&out, "| %-34s | %.3f (%.3f-%.3f)    | %.3f (%.3f-%.3f)    | %6.1f        |\n", feat.name,
			medianOf(g.rps), minOf(g.rps), maxOf(g.rps), medianOf(g.cpu), minOf(g.cpu), maxOf(g.cpu), medianOf(g.allocs))
		b.ReportMetric(medianOf(g.cpu), "cpu-ratio:"+strings.ReplaceAll(strings.TrimPrefix(feat.name, "-"), " ", "_"))
	}
	fmt.Fprintf(&out, "| %-34s | 1                      | 1                      | %6.1f        |\n", "stock Caddy", medianOf(stockAllocs))
	// Printed whole: a benchmark's log is cut after a few lines.
	fmt.Print(out.String())
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
