package integration

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The fleet-wide limit of the issue: 150 requests per 3 s window over
// the route, whichever gateway a request reaches.
const (
	rlLimit  = 150
	rlWindow = 3 * time.Second
	// rlRate is the client's pace, spread over the gateways: 1.5 times
	// the limit, so that every window reaches it (after 2 s).
	rlRate = 75
)

const rateLimitManifest = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 1
    env: {VERSION: "1"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com], rate_limit: {requests: 150, window: 3s, key: route}}]
`

// TestRateLimitAcrossGateways: one client spreads its requests over
// three real gateways; the fleet holds the limit within 10%; a gateway
// cut from the store keeps to its share (and the others leave it that
// share); when it comes back the fleet shares counts again.
func TestRateLimitAcrossGateways(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	link := newStoreLink(t, strings.TrimPrefix(c.url, "nats://"))
	gws := []*gateway{c.startGateway("gw1"), c.startGateway("gw2"), c.startGatewayVia("gw3", "nats://"+link.addr())}

	// Bad input first: refused with its field path, nothing written.
	bad := strings.Replace(rateLimitManifest, "window: 3s", "window: 100ms", 1)
	if _, errOut, code := c.control("deploy", "apply", "-f", c.manifest("bad.yaml", bad)); code == 0 ||
		!strings.Contains(errOut, "services.web.routes[0].rate_limit.window: must be a duration between 1s and 1h0m0s") {
		t.Fatalf("a window of 100ms: exit %d, %s", code, errOut)
	}
	if ins := c.instances("shop"); len(ins) != 0 {
		t.Fatalf("a refused manifest wrote %d instances", len(ins))
	}
	c.mustControl("deploy", "apply", "-f", c.manifest("shop.yaml", rateLimitManifest), "--drain-grace", "100ms")
	// Every gateway serves the route before the first window counted.
	for _, g := range gws {
		if code, _ := rlGet(g); code != 200 {
			t.Fatalf("gateway %s before any limit: %d", g.http, code)
		}
	}

	// Shared: the fleet's total per window is the limit, within 10%.
	shared := rlRun(t, gws, 3)
	for _, w := range shared {
		t.Logf("shared: window of %d allowed (%v per gateway), limit %d", w.total(), w.allowed, rlLimit)
		rlWithin(t, "shared", w.total(), rlLimit)
	}

	// gw3 cut from the store: it allows its share (a third, as it saw
	// in the last window), and the others keep that share for it.
	link.cut(true)
	deadline := time.Now().Add(10 * time.Second)
	for st, err := gws[2].projection(); err != nil || st.Connected; st, err = gws[2].projection() {
		if time.Now().After(deadline) {
			t.Fatalf("gw3 still connected through a cut link: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond) // past the silence that says cut to the others
	cut := rlRun(t, gws, 3)
	for _, w := range cut {
		t.Logf("gw3 cut: window of %d allowed (%v per gateway)", w.total(), w.allowed)
		rlWithin(t, "gw3 cut", w.total(), rlLimit)
		if got := w.allowed[2]; got < rlLimit/3-rlLimit/15 || got > rlLimit/3+rlLimit/15 {
			t.Fatalf("cut gw3 allowed %d in a window, want its share of about %d", got, rlLimit/3)
		}
	}

	// Back: it reconnects, hears the others and itself, and the fleet
	// shares counts again.
	link.cut(false)
	deadline = time.Now().Add(15 * time.Second)
	for st, err := gws[2].projection(); err != nil || !st.Connected; st, err = gws[2].projection() {
		if time.Now().After(deadline) {
			t.Fatalf("gw3 did not reconnect: %+v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	back := rlRun(t, gws, 3)
	for _, w := range back {
		t.Logf("gw3 back: window of %d allowed (%v per gateway)", w.total(), w.allowed)
		rlWithin(t, "gw3 back", w.total(), rlLimit)
	}
	var worst float64
	for _, w := range append(append(shared, cut...), back...) {
		worst = max(worst, abs(float64(w.total()-rlLimit))/rlLimit)
	}
	t.Logf("fleet-wide accuracy: %d windows over 3 gateways, worst %.1f%% off the limit of %d per %s",
		len(shared)+len(cut)+len(back), 100*worst, rlLimit, rlWindow)
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func rlWithin(t *testing.T, phase string, got, limit int) {
	t.Helper()
	if got < limit*9/10 || got > limit*11/10 {
		t.Fatalf("%s: %d allowed in a window, want %d within 10%%", phase, got, limit)
	}
}

// rlWindowCount is what one window allowed at each gateway.
type rlWindowCount struct {
	allowed [3]int
}

func (w rlWindowCount) total() int { return w.allowed[0] + w.allowed[1] + w.allowed[2] }

// rlRun sends requests at rlRate, turn by turn to each gateway, from the
// start of the next window for n windows, and counts what each window
// allowed. A 429 must say when the window ends.
func rlRun(t *testing.T, gws []*gateway, n int) []rlWindowCount {
	t.Helper()
	start := time.Now().Truncate(rlWindow).Add(rlWindow)
	time.Sleep(time.Until(start))
	out := make([]rlWindowCount, n)
	tick := time.NewTicker(time.Second / rlRate)
	defer tick.Stop()
	end := start.Add(time.Duration(n) * rlWindow)
	for i := 0; ; i++ {
		at := <-tick.C
		if !at.Before(end) {
			return out
		}
		code, retry := rlGet(gws[i%len(gws)])
		switch code {
		case 200:
			out[int(at.Sub(start)/rlWindow)].allowed[i%len(gws)]++
		case http.StatusTooManyRequests:
			if s, err := strconv.Atoi(retry); err != nil || s < 1 || s > int(rlWindow/time.Second) {
				t.Fatalf("429 with Retry-After %q", retry)
			}
		default:
			t.Fatalf("gateway %d answered %d", i%len(gws)+1, code)
		}
	}
}

var rlClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

func rlGet(g *gateway) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/", nil)
	req.Host = "shop.example.com"
	resp, err := rlClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// startGatewayVia starts a gateway that reaches the store at url.
func (c *cluster) startGatewayVia(name, url string) *gateway {
	g, path, env := c.gatewayConfig(name, map[string]any{"handler": "edgeplane"})
	b, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		c.t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["edgeplane"].(map[string]any)["nats_url"] = url
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	g.proc = start(c.t, "caddy "+name, env, bins.caddy, "run", "--config", path)
	g.waitConnected(c.t, name)
	return g
}

// storeLink is a TCP path to the store that the test cuts: cut, every
// connection through it ends and new ones are refused.
type storeLink struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newStoreLink(t *testing.T, target string) *storeLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &storeLink{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); l.cut(true) })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			if l.down.Load() {
				in.Close()
				continue
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, in, out)
			l.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return l
}

func (l *storeLink) addr() string { return l.ln.Addr().String() }

func (l *storeLink) cut(down bool) {
	l.down.Store(down)
	if !down {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}
