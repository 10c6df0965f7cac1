package caddymodule

import (
	"net/http"
	"sort"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkBasicAuth compares, through one gateway to the same backends,
// a route with basic_auth (one user, bcrypt at cost 10, the client
// sending the right password every time) against a route without, in
// alternating rounds of identical load, and reports the req/s ratio
// (goal >= 0.95): with Caddy's hash_cache (the gateway's setting), and
// once without it, which costs a bcrypt per request; and the ratio of
// CPU per request, the overhead on a busy machine. Run with
// -benchtime=1x.
func BenchmarkBasicAuth(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.load()
	hash, err := bcrypt.GenerateFromPassword([]byte("wonderland"), bcrypt.DefaultCost)
	if err != nil {
		b.Fatal(err)
	}
	users := func(name string) *store.BasicAuth {
		return &store.BasicAuth{Users: []store.BasicAuthUser{{Username: name, Hash: string(hash)}}}
	}
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/plain"}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/auth"}, BasicAuth: users("alice")},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/nocache"}, BasicAuth: users("bob")},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	plain := "http://" + f.gateway + "/plain"
	auth := "http://alice:wonderland@" + f.gateway + "/auth"
	nocache := "http://bob:wonderland@" + f.gateway + "/nocache"
	loadRun(b, client, plain, "bench.test", workers, 300*time.Millisecond)
	loadRun(b, client, auth, "bench.test", workers, 300*time.Millisecond)
	// The /nocache route's handler is made (at its first request) with
	// the cache off; the configurations differ, so it is its own.
	basicAuthHashCache = false
	loadRun(b, client, nocache, "bench.test", 1, 100*time.Millisecond)
	basicAuthHashCache = true
	b.ResetTimer()
	var ratios, cpuRatios []float64
	var plainRPS, authRPS float64
	for i := 0; i < rounds; i++ {
		var pr, qr float64
		var pc, qc time.Duration
		alternate(i, func() { pr, _, _, pc = loadRun(b, client, plain, "bench.test", workers, round) },
			func() { qr, _, _, qc = loadRun(b, client, auth, "bench.test", workers, round) })
		plainRPS, authRPS = plainRPS+pr, authRPS+qr
		ratios = append(ratios, qr/pr)
		cpuRatios = append(cpuRatios, float64(qc)/float64(pc))
	}
	sort.Float64s(ratios)
	sort.Float64s(cpuRatios)
	nr, _, _, _ := loadRun(b, client, nocache, "bench.test", workers, round)
	b.ReportMetric(plainRPS/rounds, "plain-req/s")
	b.ReportMetric(authRPS/rounds, "basicauth-req/s")
	b.ReportMetric((ratios[(rounds-1)/2]+ratios[rounds/2])/2, "rps-ratio(basicauth/plain)")
	// This process's CPU per request (gateway, backends and clients
	// together), less disturbed than req/s by other work on the machine.
	b.ReportMetric((cpuRatios[(rounds-1)/2]+cpuRatios[rounds/2])/2, "cpu/req-ratio(basicauth/plain)")
	b.ReportMetric(nr, "nocache-req/s")
	b.ReportMetric(nr/(plainRPS/rounds), "rps-ratio(nocache/plain)")
}
