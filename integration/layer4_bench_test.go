package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestL4Bench measures the issue 41 goals, each against a baseline taken
// in the same run: TCP throughput through a gateway port vs straight to
// the instance (iperf3, rounds interleaved), the connection setup latency
// the gateway adds (a new connection and its first Redis reply, p50/p99),
// failed commands across a redeploy under load, and HTTP req/s of a
// gateway with layer 4 vs one identical but for it (wrk). Run by
// scripts/bench-l4 with EDGEPLANE_BENCH_L4=1; it fails only when it cannot
// measure, and prints a table.
func TestL4Bench(t *testing.T) {
	if os.Getenv("EDGEPLANE_BENCH_L4") != "1" {
		t.Skip("a benchmark: scripts/bench-l4 runs it (EDGEPLANE_BENCH_L4=1)")
	}
	needTool(t, "redis-server", "redis-benchmark", "iperf3", "wrk")
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	c := newCluster(t)
	c.join("m1")
	gw := c.startL4Gateway("gw-l4", true)
	plain := c.startL4Gateway("gw-plain", false)
	for _, m := range []struct{ name, body string }{
		{"kv.yaml", redisManifest("1")}, {"iperf.yaml", iperfManifest},
		{"shop.yaml", strings.Replace(httpsShopManifest, "readiness:", "replicas: 2\n    readiness:", 1)},
		{"certs.yaml", passthroughManifest},
	} {
		c.mustControl("deploy", "apply", "-f", c.l4manifest(m.name, m.body), "--drain-grace", "100ms", "--gateway-wait", "10s")
	}
	eventually(t, 10*time.Second, "redis and iperf3 through the gateway", func() bool {
		_, err := redisOnce(gw.at(6379), time.Second)
		conn, err2 := net.DialTimeout("tcp", gw.at(5201), time.Second)
		if err2 == nil {
			conn.Close()
		}
		return err == nil && err2 == nil
	})
	iperfDirect := addrOf(c.instances("iperf")[0])
	redisDirect := addrOf(c.instances("kv")[0])

	type row struct{ measure, through, direct, ratio, goal string }
	var table []row

	// Throughput: iperf3 rounds, through and direct in turn.
	// A bare proxy in this process (io.Copy both ways: splice) is what a
	// plain user-space proxy gets on this box, to read the gateway's ratio
	// against: iperf3's two ends alone can keep two cores busy.
	bare := bareProxy(t, iperfDirect)
	var thr, dir, bareThr []float64
	for i := 0; i < rounds; i++ {
		// ABBA: a drift of the box's load over the run favours neither.
		if i%2 == 0 {
			thr = append(thr, iperfGbps(t, gw.at(5201)))
			dir = append(dir, iperfGbps(t, iperfDirect))
			bareThr = append(bareThr, iperfGbps(t, bare))
		} else {
			bareThr = append(bareThr, iperfGbps(t, bare))
			dir = append(dir, iperfGbps(t, iperfDirect))
			thr = append(thr, iperfGbps(t, gw.at(5201)))
		}
	}
	tm, dm, bm := medianOf(thr), medianOf(dir), medianOf(bareThr)
	table = append(table, row{"TCP throughput (iperf3, median of " + strconv.Itoa(rounds) + " x 3 s)",
		fmt.Sprintf("%.2f Gbit/s", tm), fmt.Sprintf("%.2f Gbit/s", dm), fmt.Sprintf("%.2fx", tm/dm), ">= 0.9x"})
	table = append(table, row{"TCP throughput, a bare Go proxy (io.Copy, splice) for reference",
		fmt.Sprintf("%.2f Gbit/s", bm), fmt.Sprintf("%.2f Gbit/s", dm), fmt.Sprintf("%.2fx", bm/dm), ""})

	// Connection setup: a new connection and its first reply, through
	// and direct in turn; the added latency is the difference of the
	// percentiles (one instance: the direct address is kv's first, and the
	// gateway's pick among two does not change a loopback connect).
	var through, direct []time.Duration
	for i := 0; i < 2000; i++ {
		through = append(through, connectTime(t, gw.at(6379)))
		direct = append(direct, connectTime(t, redisDirect))
	}
	for _, p := range []float64{0.50, 0.99} {
		a, b := pct(through, p), pct(direct, p)
		goal := "<= 0.2 ms"
		if p == 0.99 {
			goal = "<= 1 ms"
		}
		table = append(table, row{fmt.Sprintf("connection setup p%.0f (connect + first redis reply, 2000 each)", p*100),
			fmtMs(a), fmtMs(b), "+" + fmtMs(a-b), goal})
	}

	// A redeploy under load: redis-benchmark with a new connection per
	// command, and a Go client doing the same.
	stop := make(chan struct{})
	outcomes := redisLoad(gw.at(6379), 4, stop)
	bench := start(t, "redis-benchmark", nil, "redis-benchmark", "-h", gw.bind, "-p", "6379",
		"-k", "0", "-c", "4", "-n", "500", "-t", "ping,set,get", "-q", "-l")
	time.Sleep(time.Second)
	c.mustControl("deploy", "apply", "-f", c.l4manifest("kv2.yaml", redisManifest("2")), "--drain-grace", "100ms", "--gateway-wait", "10s")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	all := outcomes()
	benchAlive := true
	select {
	case <-bench.done:
		benchAlive = false
	default:
	}
	bench.stop(syscall.SIGINT)
	failed := 0
	for _, o := range all {
		if !o.ok {
			failed++
		}
	}
	benchFailed := "0"
	if !benchAlive || strings.Contains(bench.output(), "Error") {
		benchFailed = "failed (it stops at its first)"
	}
	table = append(table, row{"failed commands across a redeploy (new connection each)",
		fmt.Sprintf("%d of %d (Go); redis-benchmark: %s, %d tests of 500", failed, len(all), benchFailed,
			len(benchResultRe.FindAllString(bench.output(), -1))), "", "", "0"})

	// HTTP req/s, the two gateways in turn.
	var l4rps, plainRps []float64
	for i := 0; i < rounds; i++ {
		if i%2 == 0 {
			l4rps = append(l4rps, wrkRps(t, gw.http))
			plainRps = append(plainRps, wrkRps(t, plain.http))
		} else {
			plainRps = append(plainRps, wrkRps(t, plain.http))
			l4rps = append(l4rps, wrkRps(t, gw.http))
		}
	}
	lm, pm := medianOf(l4rps), medianOf(plainRps)
	table = append(table, row{"HTTP req/s, layer 4 loaded vs not (wrk -c8, median of " + strconv.Itoa(rounds) + " x 5 s)",
		fmt.Sprintf("%.0f", lm), fmt.Sprintf("%.0f", pm), fmt.Sprintf("%.3fx", lm/pm), ">= 0.99x"})

	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("bench-l4: %d cores, loopback, load average at the end %s\n", runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Println("| measure | through the gateway | baseline | ratio / added | goal |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range table {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", r.measure, r.through, r.direct, r.ratio, r.goal)
	}
}

// iperf3's server as a process service, reached on the gateway's 5201.
const iperfManifest = `
namespace: iperf
services:
  iperf:
    command: ["/bin/sh", "-c", 'exec iperf3 -s -p "$PORT" -B "$HOST"']
    readiness: {timeout: 10s}
    tcp: [{port: 5201}]
`

// iperfGbps runs a 3 s iperf3 test against addr (tried again once: a
// health probe's connection may hold the one-test server a moment).
func iperfGbps(t *testing.T, addr string) float64 {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	var out []byte
	var err error
	for try := 0; try < 3; try++ {
		out, err = exec.Command("iperf3", "-c", host, "-p", port, "-t", "3", "-J").Output()
		if err == nil {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err != nil || json.Unmarshal(out, &res) != nil || res.End.SumReceived.BitsPerSecond == 0 {
		t.Fatalf("iperf3 to %s: %v\n%s", addr, err, out)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

// connectTime is how long a new connection to addr takes to bring its
// first Redis reply.
func connectTime(t *testing.T, addr string) time.Duration {
	t.Helper()
	start := time.Now()
	c, err := dialRedis(addr, 2*time.Second)
	if err != nil {
		t.Fatalf("connecting to %s: %v", addr, err)
	}
	defer c.Close()
	if _, err := c.do("PING", 2*time.Second); err != nil {
		t.Fatalf("PING through %s: %v", addr, err)
	}
	return time.Since(start)
}

var wrkRpsRe = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)

// wrkRps is wrk's req/s against addr for shop.example.com over 5 s.
func wrkRps(t *testing.T, addr string) float64 {
	t.Helper()
	out, err := exec.Command("wrk", "-t1", "-c8", "-d5s", "-H", "Host: shop.example.com", "http://"+addr+"/").CombinedOutput()
	m := wrkRpsRe.FindSubmatch(out)
	if err != nil || m == nil || strings.Contains(string(out), "Non-2xx") {
		t.Fatalf("wrk against %s: %v\n%s", addr, err, out)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

// bareProxy forwards a loopback port of its own to upstream with io.Copy
// each way (splice between TCP sockets), until the test ends.
func bareProxy(t *testing.T, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(u, c)
					_ = u.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				_, _ = io.Copy(c, u)
				_ = c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}
