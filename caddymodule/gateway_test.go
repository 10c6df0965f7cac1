package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestGatewayRoutesFollowsDeploysWithoutReload(t *testing.T) {
	f := newFixture(t)
	w1, w2, api := newBackend(t, "web-1"), newBackend(t, "web-2"), newBackend(t, "api-1")
	seq := f.deploy("shop", map[string]storetest.Service{
		"web": svc([]string{"shop.test", "*.shop.test"}, nil, w1, w2),
		"api": svc([]string{"shop.test"}, []string{"/api"}, api),
	})
	f.load()
	f.waitSeq(seq)

	// Exact host, wildcard host, path prefix; both web instances serve.
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		r := f.mustGet("shop.test", "/")
		if r.status != 200 || !strings.HasPrefix(r.backend, "web-") {
			t.Fatalf("shop.test/ -> %d from %q", r.status, r.backend)
		}
		seen[r.backend] = true
	}
	if !seen["web-1"] || !seen["web-2"] {
		t.Errorf("load balancing reached only %v", seen)
	}
	if r := f.mustGet("eu.shop.test:8080", "/x"); r.status != 200 || !strings.HasPrefix(r.backend, "web-") {
		t.Errorf("wildcard host -> %d from %q", r.status, r.backend)
	}
	if r := f.mustGet("SHOP.test", "/api/orders"); r.status != 200 || r.backend != "api-1" {
		t.Errorf("/api/orders -> %d from %q", r.status, r.backend)
	}
	if r := f.mustGet("shop.test", "/apix"); r.backend == "api-1" {
		t.Errorf("/apix reached the api service")
	}

	// Unknown host: a clear 404 naming nothing internal.
	r := f.mustGet("unknown.test", "/")
	if r.status != http.StatusNotFound || r.body != "no route for this host\n" {
		t.Errorf("unknown host -> %d %q", r.status, r.body)
	}

	// A redeploy replaces the endpoints: no reload, next requests go to the
	// new instance only.
	loadsBefore := f.proj().Status().Loads
	w3 := newBackend(t, "web-3")
	seq = f.deploy("shop", map[string]storetest.Service{
		"web": svc([]string{"shop.test", "*.shop.test"}, nil, w3),
	})
	f.waitSeq(seq)
	for i := 0; i < 20; i++ {
		if r := f.mustGet("shop.test", "/"); r.backend != "web-3" {
			t.Fatalf("after redeploy shop.test -> %q", r.backend)
		}
	}
	// api left the manifest: its prefix now falls to web.
	if r := f.mustGet("shop.test", "/api/orders"); r.backend != "web-3" {
		t.Errorf("after removal /api/orders -> %d from %q", r.status, r.backend)
	}
	if l := f.proj().Status().Loads; l != loadsBefore {
		t.Errorf("events caused a reload of the projection (%d -> %d loads)", loadsBefore, l)
	}

	// A service with no routable instance answers 503 without detail.
	seq = f.deploy("shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.test"}}},
			Instances: []storetest.Instance{{ID: "starting", Machine: "m1", Address: w3.host, Port: w3.port, State: store.InstanceStarting}}},
	})
	f.waitSeq(seq)
	if r := f.mustGet("shop.test", "/"); r.status != http.StatusServiceUnavailable || r.body != "service unavailable\n" {
		t.Errorf("no routable instance -> %d %q", r.status, r.body)
	}
}

func TestDrainingInstanceLeavesPoolAtOnce(t *testing.T) {
	f := newFixture(t)
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	seq := f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, a, b, c)})
	f.load()
	f.waitSeq(seq)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seq, err := storetest.SetInstance(ctx, f.nats.Store, "shop", "b", store.InstanceDraining, "")
	if err != nil {
		t.Fatal(err)
	}
	f.waitSeq(seq)
	seq, err = storetest.SetInstance(ctx, f.nats.Store, "shop", "c", store.InstanceReady, "oom killed")
	if err != nil {
		t.Fatal(err)
	}
	f.waitSeq(seq)
	for i := 0; i < 30; i++ {
		if r := f.mustGet("shop.test", "/"); r.backend != "a" {
			t.Fatalf("request reached %q after it drained or failed", r.backend)
		}
	}
}

func TestRetriesSkipADeadInstance(t *testing.T) {
	f := newFixture(t)
	f.handler = map[string]any{
		"load_balancing": map[string]any{"retries": 3, "selection_policy": map[string]any{"policy": "round_robin"}},
		"health_checks":  map[string]any{"passive": map[string]any{"fail_duration": "10s"}},
	}
	live := newBackend(t, "live")
	dead := freeAddr(t) // nothing listens here
	host, port := splitHostPort(t, dead)
	seq := f.deploy("shop", map[string]storetest.Service{"web": {
		Routes: []store.Route{{Hosts: []string{"shop.test"}}},
		Instances: []storetest.Instance{live.instance(),
			{ID: "dead", Machine: "m1", Address: host, Port: port}},
	}})
	f.load()
	f.waitSeq(seq)
	for i := 0; i < 20; i++ {
		if r := f.mustGet("shop.test", "/"); r.status != 200 || r.backend != "live" {
			t.Fatalf("request %d: %d from %q; retries should skip the dead instance", i, r.status, r.backend)
		}
	}
}

func TestKeepsServingWithoutNATSAndCatchesUp(t *testing.T) {
	natsDir, natsAddr := t.TempDir(), freeAddr(t)
	srv := storetest.StartIn(t, natsDir, natsAddr)
	f := newFixture(t)
	f.nats, f.natsURL = srv, srv.URL
	w1 := newBackend(t, "web-1")
	seq := f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, w1)})
	f.load()
	f.waitSeq(seq)

	lg := f.startLoad("shop.test", 4)
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, wait, "gateway to notice NATS is gone", func() bool { return !f.proj().Status().Connected })

	// While the gateway is away, the service is redeployed more often than
	// the stream keeps events per subject: the event after the gateway's
	// position is gone, replaced by later ones of the same service.
	side := storetest.StartIn(t, natsDir, freeAddr(t))
	w2 := newBackend(t, "web-2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range store.RoutingHistory + 1 {
		if _, _, err := storetest.Deploy(ctx, side.Store, "shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, w1)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := storetest.Deploy(ctx, side.Store, "shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, w2)}); err != nil {
		t.Fatal(err)
	}
	side.NATS.Shutdown()
	side.NATS.WaitForShutdown()
	if st := f.proj().Status(); st.State != "serving-stale" {
		t.Errorf("status while NATS is down: %+v", st)
	}

	storetest.StartIn(t, natsDir, natsAddr)
	storetest.Eventually(t, wait, "catching up", func() bool {
		r, err := f.get("shop.test", "/")
		return err == nil && r.backend == "web-2"
	})
	ok, failed, first := lg.finish()
	if failed != 0 {
		t.Errorf("%d of %d requests failed across NATS loss and catching up; first: %s", failed, ok+failed, first)
	}
	if ok < 10 {
		t.Errorf("only %d requests ran", ok)
	}
	st := f.proj().Status()
	if st.Rebuilds != 0 || st.State != "serving" {
		t.Errorf("status after catching up: %+v", st)
	}
	t.Logf("%d requests, 0 failed, across NATS loss and catching up", ok)
}

func TestRestartWithNATSDownServesSnapshot(t *testing.T) {
	f := newFixture(t)
	w1 := newBackend(t, "web-1")
	seq := f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, w1)})
	f.load()
	f.waitSeq(seq)
	storetest.Eventually(t, wait, "snapshot written", func() bool {
		st := f.proj().Status()
		return st.SnapshotError == "" && fileExists(f.snap)
	})
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	f.nats.NATS.Shutdown()
	f.nats.NATS.WaitForShutdown()

	// A gateway started now cannot reach NATS: it serves the snapshot.
	f.load()
	if r := f.mustGet("shop.test", "/"); r.status != 200 || r.backend != "web-1" {
		t.Fatalf("from snapshot: %d from %q", r.status, r.backend)
	}
	code, body := f.adminGet("/edgeplane/projection")
	var st projection.Status
	if err := json.Unmarshal(body, &st); err != nil || code != 200 {
		t.Fatalf("admin projection: %d %s", code, body)
	}
	if st.State != "serving-stale" || !st.Stale || st.Connected || st.AppliedSeq != seq {
		t.Errorf("status from snapshot: %+v", st)
	}
}

func TestConfigReloadKeepsProjection(t *testing.T) {
	f := newFixture(t)
	w1 := newBackend(t, "web-1")
	seq := f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, w1)})
	f.load()
	f.waitSeq(seq)
	p := f.proj()
	loads := p.Status().Loads

	f.handler = map[string]any{"load_balancing": map[string]any{"retries": 1}}
	f.load() // a changed config: Caddy provisions everything anew
	if f.proj() != p {
		t.Fatal("config reload replaced the projection")
	}
	if r := f.mustGet("shop.test", "/"); r.backend != "web-1" {
		t.Errorf("after reload: %q", r.backend)
	}
	seq = f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test"}, nil, newBackend(t, "web-2"))})
	f.waitSeq(seq)
	if r := f.mustGet("shop.test", "/"); r.backend != "web-2" {
		t.Errorf("events after reload: %q", r.backend)
	}
	if st := p.Status(); st.Loads != loads || st.Rebuilds != 0 {
		t.Errorf("reload caused loads %d -> %d, rebuilds %d", loads, st.Loads, st.Rebuilds)
	}
}

func TestAdminAPIAndMetrics(t *testing.T) {
	f := newFixture(t)
	w1 := newBackend(t, "web-1")
	seq := f.deploy("shop", map[string]storetest.Service{"web": svc([]string{"shop.test", "*.shop.test"}, []string{"/", "/app"}, w1)})
	f.load()
	f.waitSeq(seq)

	code, body := f.adminGet("/edgeplane/projection")
	var st projection.Status
	if err := json.Unmarshal(body, &st); err != nil || code != 200 {
		t.Fatalf("projection: %d %s", code, body)
	}
	if st.State != "serving" || st.AppliedSeq != seq || st.StreamHead != seq || st.LagSeqs != 0 || st.Routable != 1 ||
		st.Gateway != "gw-test" || st.Loads != 1 {
		t.Errorf("projection status: %s", body)
	}

	code, body = f.adminGet("/edgeplane/routes")
	var routes []RouteInfo
	if err := json.Unmarshal(body, &routes); err != nil || code != 200 || len(routes) != 1 ||
		routes[0].Service != "web" || len(routes[0].Endpoints) != 1 || routes[0].Endpoints[0].Port != w1.port {
		t.Errorf("routes: %d %s", code, body)
	}

	code, body = f.adminGet("/edgeplane/hosts/eu.shop.test")
	var hi HostInfo
	if err := json.Unmarshal(body, &hi); err != nil || code != 200 || hi.Root == nil || hi.Root.Service != "web" {
		t.Errorf("hosts/eu.shop.test: %d %s", code, body)
	}
	code, body = f.adminGet("/edgeplane/hosts/*.shop.test")
	if err := json.Unmarshal(body, &hi); err != nil || code != 200 || len(hi.Routes) != 2 || hi.Routes[0].Prefix != "/app" {
		t.Errorf("hosts/*.shop.test: %d %s", code, body)
	}
	if code, body = f.adminGet("/edgeplane/hosts/nope.test"); code != 404 || !strings.Contains(string(body), "no route for host") {
		t.Errorf("hosts/nope.test: %d %s", code, body)
	}
	if code, _ = f.adminGet("/edgeplane/bogus"); code != 404 {
		t.Errorf("unknown endpoint: %d", code)
	}

	code, body = f.adminGet("/metrics")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	for _, want := range []string{
		"edgeplane_projection_events_applied_total ",
		"edgeplane_projection_rebuilds_total 0",
		"edgeplane_projection_lag_seqs 0",
		"edgeplane_projection_lag_seconds 0",
		"edgeplane_projection_routable_instances 1",
		"edgeplane_projection_connected 1",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestUpstreamSourceAndPermission(t *testing.T) {
	f := newFixture(t)
	w1, api := newBackend(t, "web-1"), newBackend(t, "api-1")
	seq := f.deploy("shop", map[string]storetest.Service{
		"web": svc([]string{"shop.test", "*.tenants.test"}, nil, w1),
		"api": svc([]string{"api.shop.test"}, nil, api),
	})
	// A user's own routes: reverse_proxy with the upstream source, once by
	// request host and once pinned to a service.
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": f.natsURL, "snapshot_path": f.snap},
			"http": map[string]any{"servers": map[string]any{"gateway": map[string]any{
				"listen": []string{f.gateway},
				"routes": []any{
					map[string]any{"match": []any{map[string]any{"path": []string{"/pinned/*"}}},
						"handle": []any{map[string]any{"handler": "reverse_proxy",
							"dynamic_upstreams": map[string]any{"source": "edgeplane", "namespace": "shop", "service": "api"}}}},
					map[string]any{"handle": []any{map[string]any{"handler": "reverse_proxy",
						"dynamic_upstreams": map[string]any{"source": "edgeplane"}}}},
				},
				"automatic_https": map[string]any{"disable": true},
			}}},
		},
	}
	b, _ := json.Marshal(cfg)
	loadCaddy(t, b)
	f.waitSeq(seq)
	if r := f.mustGet("shop.test", "/"); r.backend != "web-1" {
		t.Errorf("by host: %d %q", r.status, r.backend)
	}
	if r := f.mustGet("shop.test", "/pinned/x"); r.backend != "api-1" {
		t.Errorf("pinned: %d %q", r.status, r.backend)
	}
	if r := f.mustGet("nope.test", "/"); r.status < 500 {
		t.Errorf("unknown host with a bare reverse_proxy: %d, want a 5xx (no upstreams)", r.status)
	}

	perm := &Permission{app: current.Load()}
	for host, allowed := range map[string]bool{"shop.test": true, "SHOP.test.": true, "a.tenants.test": true,
		"api.shop.test": true, "tenants.test": false, "evil.test": false} {
		err := perm.CertificateAllowed(context.Background(), host)
		if (err == nil) != allowed {
			t.Errorf("CertificateAllowed(%q) = %v, want allowed=%v", host, err, allowed)
		}
		if err != nil && !errorsIs(err, caddytls.ErrPermissionDenied) {
			t.Errorf("denial for %q does not wrap ErrPermissionDenied: %v", host, err)
		}
	}
}

func TestHandlerRejectsOwnUpstreams(t *testing.T) {
	f := newFixture(t)
	f.handler = map[string]any{"upstreams": []any{map[string]any{"dial": "127.0.0.1:1"}}}
	err := caddy.Load(f.config(), true)
	if err == nil {
		_ = caddy.Stop()
		t.Fatal("a handler with its own upstreams loaded")
	}
	if !strings.Contains(err.Error(), "upstreams come from the routing projection") {
		t.Errorf("error = %v", err)
	}
	bad := []byte(`{"admin":{"disabled":true},"apps":{"edgeplane":{"authority":"no spaces allowed"}}}`)
	if err := caddy.Load(bad, true); err == nil || !strings.Contains(err.Error(), "authority") {
		_ = caddy.Stop()
		t.Errorf("bad authority: %v", err)
	}
	up := &Upstreams{Namespace: "shop"}
	if err := up.Validate(); err == nil {
		t.Error("upstreams with a namespace and no service validated")
	}
}

func TestWebsocketAndStreamingPassThrough(t *testing.T) {
	f := newFixture(t)
	f.handler = map[string]any{"flush_interval": -1}
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			// A minimal upgrade: 101, then echo raw bytes back.
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = rw.Flush()
			buf := make([]byte, 5)
			if _, err := io.ReadFull(rw, buf); err == nil {
				_, _ = conn.Write(buf)
			}
			return
		}
		// Streaming: the first chunk must reach the client before the
		// handler finishes.
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		<-release
		_, _ = io.WriteString(w, "second\n")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	host, port := splitHostPort(t, srv.Listener.Addr().String())
	seq := f.deploy("rt", map[string]storetest.Service{"ws": {Routes: []store.Route{{Hosts: []string{"rt.test"}}},
		Instances: []storetest.Instance{{ID: "ws1", Machine: "m1", Address: host, Port: port}}}})
	f.load()
	f.waitSeq(seq)

	req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/stream", nil)
	req.Host = "rt.test"
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first streamed chunk: %q %v", line, err)
	}
	close(release)
	resp.Body.Close()

	conn, err := net.DialTimeout("tcp", f.gateway, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: rt.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(conn)
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through the gateway: %v %v", up, err)
	}
	_, _ = io.WriteString(conn, "hello")
	echo := make([]byte, 5)
	if _, err := io.ReadFull(br, echo); err != nil || string(echo) != "hello" {
		t.Fatalf("websocket echo: %q %v", echo, err)
	}
}
