package caddymodule

import (
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkRateLimit compares, in one process against the same backends,
// a route with a rate limit high enough never to refuse (every request
// counted under its key, the counts shared every 250 ms) and the same
// route without one, in alternating rounds of identical load, and
// reports the req/s ratio (goal >= 0.95). Run with -benchtime=1x.
func BenchmarkRateLimit(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.load()
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/plain"}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/limited"},
				RateLimit: &store.RateLimit{Requests: 1 << 40, Window: store.Duration(time.Second)}},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	plain, limited := "http://"+f.gateway+"/plain", "http://"+f.gateway+"/limited"
	loadRun(b, client, plain, "bench.test", workers, 300*time.Millisecond)
	loadRun(b, client, limited, "bench.test", workers, 300*time.Millisecond)
	b.ResetTimer()
	var ratios []float64
	var plainRPS, limitedRPS float64
	for i := 0; i < rounds; i++ {
		var pr, lr float64
		alternate(i, func() { pr, _, _, _ = loadRun(b, client, plain, "bench.test", workers, round) },
			func() { lr, _, _, _ = loadRun(b, client, limited, "bench.test", workers, round) })
		plainRPS, limitedRPS = plainRPS+pr, limitedRPS+lr
		ratios = append(ratios, lr/pr)
	}
	sort.Float64s(ratios)
	b.ReportMetric(plainRPS/rounds, "plain-req/s")
	b.ReportMetric(limitedRPS/rounds, "limited-req/s")
	b.ReportMetric((ratios[(rounds-1)/2]+ratios[rounds/2])/2, "rps-ratio(limited/plain)")
}

// BenchmarkRateLimitAllow is the limiter's own cost per request, from
// many goroutines over many keys.
func BenchmarkRateLimitAllow(b *testing.B) {
	rt := newRateTable("gw")
	rt.down.Store(false)
	rt.heard.Store(time.Now().UnixNano() + int64(time.Hour))
	l, err := rt.limiter(&projection.Service{Namespace: "bench", Name: "web"}, 0, &store.RateLimit{Requests: 1 << 40, Window: store.Duration(time.Second)})
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		var i uint64
		for pb.Next() {
			i++
			l.allow(hashKey("198.51.100.1")+i%1024, time.Now())
		}
	})
}
