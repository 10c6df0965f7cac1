package caddymodule

import (
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// cidrs returns n distinct /24s that do not touch (so none merge), and
// the loopback's /8, so the bench client is inside.
func cidrs(n int) []string {
	out := []string{"127.0.0.0/8"}
	for i := 0; len(out) <= n; i++ {
		out = append(out, fmt.Sprintf("10.%d.%d.0/24", (2*i)/256, (2*i)%256))
	}
	return out
}

// BenchmarkIPList compares, through one gateway to the same backends, a
// route with an allow list of 1,000 CIDRs and a deny list of 1,000
// addresses ("listed") against a route without policy ("plain"), and
// against a route whose allow list is one CIDR ("one"), so the list's size
// is told apart from the policy's own path, in alternating rounds of
// identical load; it reports the req/s ratios (goal >= 0.95) and the
// process's CPU per request (client, gateway and backends share the
// process). Run with -benchtime=1x.
func BenchmarkIPList(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	f.load()
	deny := make([]string, 1000)
	for i := range deny {
		deny[i] = fmt.Sprintf("192.168.%d.%d", i/250, 1+i%250)
	}
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b1.instance(), b2.instance()},
		Routes: []store.Route{
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/plain"}},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/listed"}, Allow: cidrs(1000), Deny: deny},
			{Hosts: []string{"bench.test"}, PathPrefixes: []string{"/one"}, Allow: []string{"127.0.0.0/8"}},
		},
	}}))
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	arms := []string{"plain", "listed", "one"}
	for _, a := range arms {
		loadRun(b, client, "http://"+f.gateway+"/"+a, "bench.test", workers, 300*time.Millisecond)
	}
	b.ResetTimer()
	rps := map[string][]float64{}
	cpu := map[string]time.Duration{}
	for i := 0; i < rounds; i++ {
		// Rotate the order so no arm always runs first.
		for k := range arms {
			a := arms[(i+k)%len(arms)]
			r, _, _, c := loadRun(b, client, "http://"+f.gateway+"/"+a, "bench.test", workers, round)
			rps[a] = append(rps[a], r)
			cpu[a] += c
		}
	}
	ratio := func(a string) float64 {
		var rs []float64
		for i := range rps[a] {
			rs = append(rs, rps[a][i]/rps["plain"][i])
		}
		sort.Float64s(rs)
		return (rs[(rounds-1)/2] + rs[rounds/2]) / 2
	}
	mean := func(xs []float64) float64 {
		var s float64
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	b.ReportMetric(mean(rps["plain"]), "plain-req/s")
	b.ReportMetric(mean(rps["listed"]), "listed-req/s")
	b.ReportMetric(ratio("listed"), "rps-ratio(listed/plain)")
	b.ReportMetric(ratio("one"), "rps-ratio(one/plain)")
	for _, a := range arms {
		b.ReportMetric(float64(cpu[a].Microseconds())/rounds, a+"-cpu-us/req")
	}
}

// BenchmarkIPFilterAdmits is the lookup alone: an allow list of 10,000
// CIDRs (the manifest's bound) and 1,000 denied addresses, v4 and v6
// clients.
func BenchmarkIPFilterAdmits(b *testing.B) {
	allow, err := newIPSet(append(cidrs(10000), "2001:db8::/32"))
	if err != nil {
		b.Fatal(err)
	}
	var d []string
	for i := 0; i < 1000; i++ {
		d = append(d, fmt.Sprintf("10.%d.%d.7", (2*i)/256, (2*i)%256))
	}
	deny, err := newIPSet(d)
	if err != nil {
		b.Fatal(err)
	}
	f := &ipFilter{allow: allow, deny: deny}
	for _, c := range []struct {
		name string
		addr netip.Addr
		want bool
	}{
		{"v4 inside", netip.MustParseAddr("10.30.20.9"), true},
		{"v4 denied", netip.MustParseAddr("10.0.2.7"), false},
		{"v4 outside", netip.MustParseAddr("10.30.21.9"), false},
		{"v6 inside", netip.MustParseAddr("2001:db8::1"), true},
	} {
		if got := f.admits(c.addr); got != c.want {
			b.Fatalf("%s: admits %v", c.name, got)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				f.admits(c.addr)
			}
		})
	}
}
