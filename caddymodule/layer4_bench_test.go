package caddymodule

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store/storetest"
)

// sinkServer is a TCP instance that reads until the client half-closes,
// then answers "ok"; helloServer one that writes one byte on accept.
func sinkServer(b testing.TB) *echoServer {
	return byteServer(b, "sink", func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c)
		_, _ = c.Write([]byte("ok"))
	})
}

func helloServer(b testing.TB) *echoServer {
	return byteServer(b, "hello", func(c net.Conn) { _, _ = c.Write([]byte{'!'}) })
}

func byteServer(b testing.TB, name string, serve func(net.Conn)) *echoServer {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return serveOn(b, ln, name, serve)
}

// serveOn serves each connection ln accepts with serve, until the test
// ends.
func serveOn(b testing.TB, ln net.Listener, name string, serve func(net.Conn)) *echoServer {
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return &echoServer{name: name, host: "127.0.0.1", port: ln.Addr().(*net.TCPAddr).Port}
}

// upload sends n bytes to addr, half-closes and waits for "ok"; it
// returns the throughput in MB/s.
func upload(b *testing.B, addr string, n int) float64 {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	start := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	_ = c.(*net.TCPConn).CloseWrite()
	ok, err := io.ReadAll(c)
	if err != nil || string(ok) != "ok" {
		b.Fatalf("upload to %s: %q, %v", addr, ok, err)
	}
	return float64(n) / (1 << 20) / time.Since(start).Seconds()
}

// connects opens n connections to addr one after another, each until the
// first byte arrives, and returns the times sorted.
func connects(b *testing.B, addr string, n int) []time.Duration {
	b.Helper()
	out := make([]time.Duration, 0, n)
	one := make([]byte, 1)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(t0))
		c.Close()
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func medianOf(xs []float64) float64 {
	sort.Float64s(xs)
	return (xs[(len(xs)-1)/2] + xs[len(xs)/2]) / 2
}

// BenchmarkL4Proxy compares, in one process, TCP through a gateway port
// (layer4.handlers.edgeplane) with a direct connection to the same
// instance, in alternating rounds: upload throughput (ratio, goal >= 0.9)
// and the time to connect and receive a first byte (p50/p99 added by the
// gateway, goal <= 0.2 ms / 1 ms on loopback). Run with -benchtime=1x.
func BenchmarkL4Proxy(b *testing.B) {
	f := newFixture(b)
	f.app = map[string]any{"layer4_bind": "127.0.0.1", "disable_health_checks": true}
	sink, hello := sinkServer(b), helloServer(b)
	psink, phello := freePort(b, "tcp"), freePort(b, "tcp")
	f.load()
	f.waitSeq(f.deploy("bench", map[string]storetest.Service{
		"sink":  l4svc([]int{psink}, nil, sink.instance("m1")),
		"hello": l4svc([]int{phello}, nil, hello.instance("m1")),
	}))
	gwSink, gwHello := net.JoinHostPort("127.0.0.1", strconv.Itoa(psink)), net.JoinHostPort("127.0.0.1", strconv.Itoa(phello))
	directSink, directHello := net.JoinHostPort(sink.host, strconv.Itoa(sink.port)), net.JoinHostPort(hello.host, strconv.Itoa(hello.port))
	storetest.Eventually(b, wait, "the gateway ports to open", func() bool {
		c1, err1 := net.Dial("tcp", gwSink)
		c2, err2 := net.Dial("tcp", gwHello)
		for _, c := range []net.Conn{c1, c2} {
			if c != nil {
				c.Close()
			}
		}
		return err1 == nil && err2 == nil
	})
	const rounds, size, conns = 6, 512 << 20, 2000
	upload(b, gwSink, 32<<20) // warm up
	upload(b, directSink, 32<<20)
	b.ResetTimer()
	var ratios, gwMBs, directMBs, p50s, p99s, gwP50s, gwP99s []float64
	for i := 0; i < rounds; i++ {
		var g, d float64
		alternate(i, func() { g = upload(b, gwSink, size) }, func() { d = upload(b, directSink, size) })
		ratios, gwMBs, directMBs = append(ratios, g/d), append(gwMBs, g), append(directMBs, d)
		var gl, dl []time.Duration
		alternate(i, func() { gl = connects(b, gwHello, conns) }, func() { dl = connects(b, directHello, conns) })
		ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
		p50s = append(p50s, ms(gl[conns/2]-dl[conns/2]))
		p99s = append(p99s, ms(gl[conns*99/100]-dl[conns*99/100]))
		gwP50s, gwP99s = append(gwP50s, ms(gl[conns/2])), append(gwP99s, ms(gl[conns*99/100]))
	}
	b.ReportMetric(medianOf(gwMBs), "gateway-MB/s")
	b.ReportMetric(medianOf(directMBs), "direct-MB/s")
	b.ReportMetric(medianOf(ratios), "throughput-ratio(gw/direct)")
	b.ReportMetric(medianOf(gwP50s), "gateway-connect-p50-ms")
	b.ReportMetric(medianOf(gwP99s), "gateway-connect-p99-ms")
	b.ReportMetric(medianOf(p50s), "added-connect-p50-ms")
	b.ReportMetric(medianOf(p99s), "added-connect-p99-ms")
}

// BenchmarkGatewayWithL4 compares the gateway's HTTP req/s with the
// layer-4 app loaded (two ports open, the passthrough listener wrapper on
// the HTTP server, so every new connection is looked at by the tls
// matcher) and without (disable_layer4, no wrapper), in alternating rounds
// of identical load, the config reloaded between them (the projection is
// kept). Goal: >= 0.99. Run with -benchtime=1x.
func BenchmarkGatewayWithL4(b *testing.B) {
	f := newFixture(b)
	b1, b2 := newBackend(b, "b1"), newBackend(b, "b2")
	sink, hello := sinkServer(b), helloServer(b)
	seq := f.deploy("bench", map[string]storetest.Service{
		"web":   svc([]string{"bench.test"}, nil, b1, b2),
		"sink":  l4svc([]int{freePort(b, "tcp")}, nil, sink.instance("m1")),
		"hello": l4svc([]int{freePort(b, "tcp")}, nil, hello.instance("m1")),
	})
	load := func(l4 bool) {
		f.app = map[string]any{"layer4_bind": "127.0.0.1", "disable_layer4": !l4}
		var cfg map[string]any
		if err := json.Unmarshal(f.config(), &cfg); err != nil {
			b.Fatal(err)
		}
		if l4 {
			srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gateway"].(map[string]any)
			srv["listener_wrappers"] = []any{
				map[string]any{"wrapper": "layer4", "routes": []any{map[string]any{
					"match":  []any{map[string]any{"tls": map[string]any{"edgeplane_passthrough": map[string]any{}}}},
					"handle": []any{map[string]any{"handler": "edgeplane"}},
				}}},
			}
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			b.Fatal(err)
		}
		loadCaddy(b, raw)
	}
	on, off := func() { load(true) }, func() { load(false) }
	on()
	f.waitSeq(seq)
	const workers, rounds = 16, 6
	round := 2 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxIdleConns: 4 * workers}}
	defer client.CloseIdleConnections()
	url := "http://" + f.gateway + "/"
	run := func(config func()) (rps float64, cpu time.Duration) {
		config()
		client.CloseIdleConnections() // new connections meet the new listener
		loadRun(b, client, url, "bench.test", workers, 200*time.Millisecond)
		rps, _, _, cpu = loadRun(b, client, url, "bench.test", workers, round)
		return rps, cpu
	}
	b.ResetTimer()
	var ratios, cpuRatios []float64
	var onRPS, offRPS float64
	for i := 0; i < rounds; i++ {
		var or, fr float64
		var oc, fc time.Duration
		alternate(i, func() { or, oc = run(on) }, func() { fr, fc = run(off) })
		onRPS, offRPS = onRPS+or, offRPS+fr
		ratios = append(ratios, or/fr)
		cpuRatios = append(cpuRatios, float64(oc)/float64(fc))
	}
	b.ReportMetric(onRPS/rounds, "l4-on-req/s")
	b.ReportMetric(offRPS/rounds, "l4-off-req/s")
	b.ReportMetric(medianOf(ratios), "rps-ratio(on/off)")
	b.ReportMetric(medianOf(cpuRatios), "cpu-per-req-ratio(on/off)")
}
