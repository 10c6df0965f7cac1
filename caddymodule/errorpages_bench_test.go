package caddymodule

import (
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkErrorPages compares, in one process against the same
// backends, a route with error_pages (every answer through the page
// writer, none replaced: the cost a healthy service pays) against the
// same route without, in alternating rounds of identical load, and
// reports the req/s ratio (goal >= 0.95, as for every route policy
// field). Run with -benchtime=1x.
func BenchmarkErrorPages(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.load()
	pages := map[int]store.ErrorPage{502: {Body: "<h1>down</h1>"}, 503: {Body: "<h1>busy</h1>"}, 504: {Body: "<h1>slow</h1>"}}
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/plain"}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/pages"}, ErrorPages: pages},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	plain, paged := "http://"+f.gateway+"/plain", "http://"+f.gateway+"/pages"
	loadRun(b, client, plain, "bench.test", workers, 300*time.Millisecond)
	loadRun(b, client, paged, "bench.test", workers, 300*time.Millisecond)
	b.ResetTimer()
	var ratios []float64
	var plainRPS, pagedRPS float64
	for i := 0; i < rounds; i++ {
		var pr, qr float64
		alternate(i, func() { pr, _, _, _ = loadRun(b, client, plain, "bench.test", workers, round) },
			func() { qr, _, _, _ = loadRun(b, client, paged, "bench.test", workers, round) })
		plainRPS, pagedRPS = plainRPS+pr, pagedRPS+qr
		ratios = append(ratios, qr/pr)
	}
	sort.Float64s(ratios)
	b.ReportMetric(plainRPS/rounds, "plain-req/s")
	b.ReportMetric(pagedRPS/rounds, "pages-req/s")
	b.ReportMetric((ratios[(rounds-1)/2]+ratios[rounds/2])/2, "rps-ratio(pages/plain)")
}
