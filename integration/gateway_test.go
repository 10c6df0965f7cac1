package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// gateway is the custom Caddy running as a process, with its own loopback
// ports: HTTP, admin and DNS.
type gateway struct {
	proc                  *proc
	http, admin, dns, dir string
	// https serves on-demand TLS, when the gateway has it.
	https string
}

func (c *cluster) startGateway(name string) *gateway {
	return c.startGatewayWith(name, map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
}

// shippedHandler is the edgeplane handler of the shipped caddy.json's
// HTTPS server, as it is there.
func shippedHandler(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("../caddy.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []map[string]any `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("caddy.json: %v", err)
	}
	for _, r := range cfg.Apps.HTTP.Servers["gateway_https"].Routes {
		for _, h := range r.Handle {
			if h["handler"] == "edgeplane" {
				return h
			}
		}
	}
	t.Fatal("caddy.json: no edgeplane handler in server gateway_https")
	return nil
}

// startGatewayWith starts a gateway whose one route is handler.
func (c *cluster) startGatewayWith(name string, handler map[string]any) *gateway {
	g, path, env := c.gatewayConfig(name, handler)
	g.proc = start(c.t, "caddy "+name, env, bins.caddy, "run", "--config", path)
	g.waitConnected(c.t, name)
	return g
}

// waitConnected waits until the gateway's projection is connected.
func (g *gateway) waitConnected(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := g.projection(); err == nil && st.Connected {
			return
		}
		if time.Now().After(deadline) {
			out := ""
			if g.proc != nil {
				out = g.proc.output()
			}
			t.Fatalf("gateway %s did not come up:\n%s", name, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatewayConfig writes the config of a gateway whose one route is handler
// and returns it with its path and the environment to run it in.
func (c *cluster) gatewayConfig(name string, handler map[string]any) (*gateway, string, []string) {
	t := c.t
	g := &gateway{http: freeAddr(t), admin: freeAddr(t), dns: freeAddr(t), dir: filepath.Join(c.dir, "gw-"+name)}
	_, httpPort, _ := net.SplitHostPort(g.http)
	cfg := map[string]any{
		"admin": map[string]any{"listen": g.admin},
		"apps": map[string]any{
			"edgeplane": map[string]any{
				"nats_url": c.url, "gateway_name": name,
				"snapshot_path":    filepath.Join(g.dir, "routing.json"),
				"traffic_interval": "1s",
			},
			"edgeplane_dns": map[string]any{"listen": []string{g.dns}, "ttl": "1s"},
			"http": map[string]any{
				"http_port": atoi(httpPort),
				"servers": map[string]any{"gw": map[string]any{
					"listen":          []string{g.http},
					"automatic_https": map[string]any{"disable": true},
					"routes":          []any{map[string]any{"handle": []any{handler}}},
				}},
			},
		},
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	path := filepath.Join(g.dir, "caddy.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + g.dir, "XDG_DATA_HOME=" + filepath.Join(g.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(g.dir, "config")}
	return g, path, env
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

type projectionStatus struct {
	State      string `json:"state"`
	Connected  bool   `json:"connected"`
	Stale      bool   `json:"stale"`
	AppliedSeq uint64 `json:"applied_seq"`
	StreamHead uint64 `json:"stream_head"`
	Rebuilds   uint64 `json:"rebuilds"`
	Routable   int    `json:"routable_instances"`
	LastError  string `json:"last_error"`
}

func (g *gateway) projection() (*projectionStatus, error) {
	resp, err := http.Get("http://" + g.admin + "/edgeplane/projection")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st projectionStatus
	return &st, json.NewDecoder(resp.Body).Decode(&st)
}

var gwClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// request sends GET path with Host host through the gateway and returns the
// answering instance ID (or the status line for non-200 answers).
func (g *gateway) request(host, path string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+path+"?format=json", nil)
	req.Host = host
	resp, err := gwClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp.StatusCode, strings.TrimSpace(string(b)), nil
	}
	var info map[string]string
	if err := json.Unmarshal(b, &info); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decoding %q: %w", b, err)
	}
	return 200, info["instance"], nil
}

// load sends requests from workers until stop is closed and counts them.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	seen       map[string]int
}

func (g *gateway) runLoad(host string, workers int, stop <-chan struct{}) (*load, *sync.WaitGroup) {
	l := &load{seen: map[string]int{}}
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, inst, err := g.request(host, "/")
				l.mu.Lock()
				if err != nil || code != 200 {
					l.failed.Add(1)
					if len(l.errs) < 10 {
						l.errs = append(l.errs, fmt.Sprintf("%d %s %v", code, inst, err))
					}
				} else {
					l.ok.Add(1)
					l.seen[inst]++
				}
				l.mu.Unlock()
			}
		}()
	}
	return l, &wg
}

func dig(t *testing.T, server, qtype, name string) []string {
	t.Helper()
	host, port, _ := net.SplitHostPort(server)
	out, err := exec.Command("dig", "+short", "+tries=1", "+time=2", "@"+host, "-p", port, name, qtype).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s %s: %v\n%s", name, qtype, err, out)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	sort.Strings(lines)
	return lines
}

const gwV1 = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 2
    env: {VERSION: "1"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com, "*.shop.example.com"]}]
`

func TestGatewayServesDeploysWithoutFailures(t *testing.T) {
	c := newCluster(t)
	c.join("m1", "--region", "eu")
	gw := c.startGateway("gw1")

	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", gwV1), "--drain-grace", "200ms")
	v1 := c.instances("shop")
	want := map[string]bool{}
	for _, in := range v1 {
		want[in.ID] = true
	}
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		for _, host := range []string{"shop.example.com", "api.shop.example.com"} {
			code, inst, err := gw.request(host, "/")
			if err != nil || code != 200 || !want[inst] {
				t.Fatalf("%s through the gateway: %d %q %v", host, code, inst, err)
			}
			seen[inst] = true
		}
	}
	if len(seen) != 2 {
		t.Fatalf("load balancing reached %d of 2 instances", len(seen))
	}
	if code, body, _ := gw.request("unknown.example.com", "/"); code != 404 || strings.Contains(body, "shop") {
		t.Fatalf("unknown host: %d %q", code, body)
	}

	// A redeploy under steady load fails no request.
	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 8, stop)
	out := c.mustControl("deploy", "apply", "-f", c.manifest("v2.yaml", strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "2"`, 1)), "--drain-grace", "300ms")
	if !strings.Contains(out, "1/1 gateways serving revision 2") {
		t.Fatalf("apply did not wait for the gateway:\n%s", out)
	}
	time.Sleep(300 * time.Millisecond) // keep the load on past the old instances' stop
	close(stop)
	wg.Wait()
	t.Logf("redeploy under load: %d requests, %d failed", l.ok.Load(), l.failed.Load())
	if l.failed.Load() != 0 || l.ok.Load() < 100 {
		t.Fatalf("redeploy under load: %d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.errs)
	}
	v2 := c.instances("shop")
	for _, in := range v2 {
		if want[in.ID] {
			t.Fatalf("old instance %s survived the redeploy", in.ID)
		}
	}

	// The same under wrk, which keeps its connections alive across the
	// switch: not one non-2xx answer nor socket error.
	w := startWrk(t, gw.http, "shop.example.com")
	c.mustControl("deploy", "apply", "-f", c.manifest("v3.yaml", strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "3"`, 1)), "--drain-grace", "300ms")
	res := w.stop(t)
	t.Logf("redeploy under wrk: %s", res)
	if res.requests < 100 || res.non2xx != 0 || res.socketErrors != 0 {
		t.Fatalf("redeploy under wrk: %s\n%s", res, res.out)
	}
	prev := map[string]bool{}
	for _, in := range v2 {
		prev[in.ID] = true
	}
	v2 = c.instances("shop")
	for _, in := range v2 {
		if prev[in.ID] || want[in.ID] {
			t.Fatalf("old instance %s survived the redeploy", in.ID)
		}
	}

	// A draining instance leaves the pool at once.
	drained := v2[0]
	if err := c.store.Call(context.Background(), drained.Machine, store.CmdDrainInstance,
		store.InstanceRequest{InstanceID: drained.ID, Namespace: "shop"}, nil); err != nil {
		t.Fatal(err)
	}
	head := routingHead(t, c)
	waitApplied(t, gw, head)
	for i := 0; i < 30; i++ {
		if _, inst, err := gw.request("shop.example.com", "/"); err != nil || inst == drained.ID {
			t.Fatalf("request %d after the drain reached %q (%v)", i, inst, err)
		}
	}

	// The admin API and metrics tell the numbers.
	st, err := gw.projection()
	if err != nil || st.AppliedSeq != head || st.StreamHead != head || st.Routable != 1 || st.State != "serving" {
		t.Fatalf("projection status: %+v %v", st, err)
	}
	resp, err := http.Get("http://" + gw.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"edgeplane_projection_events_applied_total", "edgeplane_projection_rebuilds_total",
		"edgeplane_projection_lag_seqs", "edgeplane_projection_lag_seconds", "edgeplane_projection_routable_instances 1"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

// wrkRun is a wrk process putting steady load on one host until stopped.
type wrkRun struct {
	p *proc
}

type wrkResult struct {
	requests, non2xx, socketErrors int
	out                            string
}

func (r wrkResult) String() string {
	return fmt.Sprintf("%d requests, %d non-2xx, %d socket errors", r.requests, r.non2xx, r.socketErrors)
}

// startWrk starts wrk against addr with host as the Host header; it runs
// until stop (wrk reports when interrupted).
func startWrk(t *testing.T, addr, host string) *wrkRun {
	t.Helper()
	bin, err := exec.LookPath("wrk")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("wrk is not installed; scripts/test-deps.sh installs it")
		}
		t.Skip("wrk is not installed (scripts/test-deps.sh installs it as root)")
	}
	// wrk says it is running just before it connects (line-buffered by
	// stdbuf: its stdout is a pipe); the deploy that follows takes far
	// longer than connecting on loopback.
	w := &wrkRun{p: start(t, "wrk", nil, "stdbuf", "-oL", bin, "-t1", "-c8", "-d120s", "--timeout", "5s",
		"-H", "Host: "+host, "http://"+addr+"/")}
	w.p.waitOutput(t, `threads and \d+ connections`, 10*time.Second)
	return w
}

var (
	wrkRequestsRe = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xxRe   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSocketRe   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// stop interrupts wrk and reads its report.
func (w *wrkRun) stop(t *testing.T) wrkResult {
	t.Helper()
	w.p.stop(syscall.SIGINT)
	r := wrkResult{out: w.p.output()}
	m := wrkRequestsRe.FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("no wrk report:\n%s", r.out)
	}
	r.requests, _ = strconv.Atoi(m[1])
	if m := wrkNon2xxRe.FindStringSubmatch(r.out); m != nil {
		r.non2xx, _ = strconv.Atoi(m[1])
	}
	if m := wrkSocketRe.FindStringSubmatch(r.out); m != nil {
		for _, v := range m[1:] {
			n, _ := strconv.Atoi(v)
			r.socketErrors += n
		}
	}
	return r
}

func waitApplied(t *testing.T, gw *gateway, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := gw.projection()
		if err == nil && st.AppliedSeq >= seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not apply sequence %d: %+v %v", seq, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With the control plane and NATS gone, the gateway and DNS keep answering
// from their last good state, and catch up when it returns.
func TestGatewayAndDNSSurviveControlPlaneLoss(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", gwV1), "--drain-grace", "100ms")
	insts := c.instances("shop")
	waitApplied(t, gw, routingHead(t, c))
	srv := dig(t, gw.dns, "SRV", "web.shop.edgeplane.internal")
	if len(srv) != 2 {
		t.Fatalf("SRV before the outage: %v", srv)
	}

	port := strings.TrimPrefix(c.url, "nats://")
	c.server.stop(syscall.SIGTERM) // the embedded NATS goes with it
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := gw.projection()
		if err == nil && !st.Connected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway never noticed NATS was gone: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ok := 0
	for i := 0; i < 200; i++ {
		if code, _, err := gw.request("shop.example.com", "/"); err == nil && code == 200 {
			ok++
		}
	}
	if ok != 200 {
		t.Fatalf("with NATS down the gateway served %d of 200", ok)
	}
	if got := dig(t, gw.dns, "SRV", "web.shop.edgeplane.internal"); strings.Join(got, ",") != strings.Join(srv, ",") {
		t.Fatalf("DNS with NATS down: %v, want %v", got, srv)
	}

	// A gateway restarted while NATS is down serves its snapshot.
	gw.proc.stop(syscall.SIGTERM)
	gw2 := c.restartGateway(gw)
	for i := 0; i < 50; i++ {
		code, inst, err := gw2.request("shop.example.com", "/")
		if err != nil || code != 200 || (inst != insts[0].ID && inst != insts[1].ID) {
			t.Fatalf("restarted gateway with NATS down: %d %q %v", code, inst, err)
		}
	}
	if st, _ := gw2.projection(); !st.Stale {
		t.Fatalf("a snapshot view must say it is stale: %+v", st)
	}

	c.startServer(port)
	deadline = time.Now().Add(15 * time.Second)
	for {
		st, err := gw2.projection()
		if err == nil && st.Connected && !st.Stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not reconnect: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.waitReachable("m1")
	// DNS follows a redeploy: new ports in, old ones out.
	c.mustControl("deploy", "apply", "-f", c.manifest("v2.yaml", strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "2"`, 1)), "--drain-grace", "100ms")
	after := dig(t, gw2.dns, "SRV", "web.shop.edgeplane.internal")
	if len(after) != 2 {
		t.Fatalf("SRV after redeploy: %v", after)
	}
	for _, a := range after {
		for _, b := range srv {
			if a == b {
				t.Fatalf("old SRV record %q still served after the redeploy", b)
			}
		}
	}
	if a := dig(t, gw2.dns, "A", "web.shop.edgeplane.internal"); len(a) == 0 || a[0] != "127.0.0.1" {
		t.Fatalf("A after redeploy: %v", a)
	}
	if nx := dig(t, gw2.dns, "A", "nope.shop.edgeplane.internal"); len(nx) != 0 {
		t.Fatalf("missing name answered %v", nx)
	}
}

func (c *cluster) restartGateway(old *gateway) *gateway {
	t := c.t
	g := *old
	env := []string{"HOME=" + g.dir, "XDG_DATA_HOME=" + filepath.Join(g.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(g.dir, "config")}
	g.proc = start(t, "caddy (restarted)", env, bins.caddy, "run", "--config", filepath.Join(g.dir, "caddy.json"))
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := g.projection(); err == nil && st.Routable > 0 {
			return &g
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted gateway never served its snapshot:\n%s", g.proc.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
