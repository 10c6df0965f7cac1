package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// frozen is an endpoint whose machine froze: its kernel still accepts
// connections, and nothing ever answers on them. Its thaw makes it answer
// (X-Backend: id) from then on.
func frozen(t *testing.T, id string) (inst storetest.Instance, thaw func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", id)
		_, _ = io.WriteString(w, id)
	})}
	t.Cleanup(func() {
		srv.Close()
		ln.Close()
	})
	host, port := splitHostPort(t, ln.Addr().String())
	return storetest.Instance{ID: id, Machine: "m2", Address: host, Port: port}, func() { go srv.Serve(ln) }
}

func (f *fixture) routesOf(t *testing.T, service string) RouteInfo {
	t.Helper()
	code, body := f.adminGet("/edgeplane/routes")
	if code != 200 {
		t.Fatalf("routes: %d %s", code, body)
	}
	var routes []RouteInfo
	if err := json.Unmarshal(body, &routes); err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Service == service {
			return r
		}
	}
	t.Fatalf("no service %s in %s", service, body)
	return RouteInfo{}
}

// An endpoint that accepts connections and never answers (a frozen
// machine) fails its probe at the service's readiness path and gets no new
// request, so none hangs on it; /edgeplane/routes says which and why. A
// service whose every endpoint fails is served anyway, and says so. A
// thawed endpoint is served again.
func TestHealthChecksSetAsideAFrozenEndpoint(t *testing.T) {
	// The endpoints listen before the fixture picks its free ports, so
	// that none of them takes one.
	live := newBackend(t, "live")
	stuck, thaw := frozen(t, "frozen")
	alone, _ := frozen(t, "alone")
	f := newFixture(t)
	f.handler = map[string]any{"load_balancing": map[string]any{"selection_policy": map[string]any{"policy": "round_robin"}}}
	f.app = map[string]any{"traffic_interval": "200ms"}
	seq := f.deploy("shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.test"}}}, HealthPath: "/healthz",
			Instances: []storetest.Instance{live.instance(), stuck}},
		"api": {Routes: []store.Route{{Hosts: []string{"api.shop.test"}}}, HealthPath: "/healthz",
			Instances: []storetest.Instance{alone}},
	})
	f.load()
	f.waitSeq(seq)
	storetest.Eventually(t, 5*time.Second, "the frozen endpoint to be set aside", func() bool {
		return len(f.routesOf(t, "web").SetAside) == 1
	})
	web := f.routesOf(t, "web")
	if sa := web.SetAside[0]; sa.InstanceID != "frozen" || !strings.Contains(sa.Reason, "no answer within 1s") || web.FailOpen {
		t.Fatalf("set aside: %+v", web)
	}
	for i := 0; i < 20; i++ {
		if r := f.mustGet("shop.test", "/"); r.status != 200 || r.backend != "live" {
			t.Fatalf("request %d: %d from %q: a request went to the frozen endpoint", i, r.status, r.backend)
		}
	}
	api := f.routesOf(t, "api")
	if !api.FailOpen || len(api.SetAside) != 1 {
		t.Fatalf("a service whose every endpoint failed: %+v", api)
	}
	// The gateway reports what it sets aside with its traffic, for the
	// control plane to show.
	gatewayTraffic := storetest.Bucket(t, f.nats.Store, f.nats.Store.Names.GatewayTrafficBucket())
	storetest.Eventually(t, 5*time.Second, "the set-aside endpoints in the gateway's report", func() bool {
		ent, err := gatewayTraffic.Get(context.Background(), store.GatewayKey("gw-test"))
		if err != nil {
			return false
		}
		var rep store.GatewayTraffic
		if err := store.DecodeKeyed(gatewayTraffic.Bucket(), ent.Key(), ent.Value(), &rep); err != nil {
			t.Fatal(err)
		}
		got := map[string]store.EndpointSetAside{}
		for _, sa := range rep.SetAside {
			got[sa.Instance] = sa
		}
		return len(got) == 2 && !got["frozen"].FailOpen && got["alone"].FailOpen &&
			strings.Contains(got["frozen"].Reason, "health check failed")
	})

	// Thawed, it passes its next probe and gets requests again, with no
	// deploy.
	thaw()
	storetest.Eventually(t, 5*time.Second, "the thawed endpoint to serve again", func() bool {
		r, err := f.get("shop.test", "/")
		return err == nil && r.backend == "frozen" && len(f.routesOf(t, "web").SetAside) == 0
	})
}

// failing is an endpoint that serves until it fails: from then on its
// health path and / never answer, as a machine that froze with requests
// in flight. /stream sends a line every 100 ms for 3 s, whatever happens.
func failing(t *testing.T, id string) (inst storetest.Instance, fail func()) {
	t.Helper()
	failed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", id)
		// Read the body, so that the server watches the connection and
		// ends the request's context when it closes.
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/stream":
			for i := range 30 {
				fmt.Fprintf(w, "%s %d\n", id, i)
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond) // the pace of the stream, not a wait for a condition
			}
			return
		case "/healthz":
			select {
			case <-failed:
			default:
				return
			}
		}
		// / hangs from the start: requests sent to it are in flight
		// when it fails.
		select {
		case <-r.Context().Done():
		case <-failed:
			<-r.Context().Done()
		}
	}))
	// Hanging handlers end with their requests' contexts, once the
	// server's connections are closed.
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	host, port := splitHostPort(t, srv.Listener.Addr().String())
	return storetest.Instance{ID: id, Machine: "m2", Address: host, Port: port}, sync.OnceFunc(func() { close(failed) })
}

// Requests already waiting on an endpoint when its probe fails are
// abandoned and retried on another endpoint: a GET is answered by the
// live one, a POST (not retried by default) gets 502 at once; neither
// waits for the client to give up. A response under way from the failing
// endpoint is not cut.
func TestRequestsWaitingOnAFailingEndpointAreRetried(t *testing.T) {
	live := newBackend(t, "live")
	stuck, fail := failing(t, "stuck")
	f := newFixture(t)
	f.handler = map[string]any{"load_balancing": map[string]any{
		"selection_policy": map[string]any{"policy": "first"}, "retries": 2}}
	// "first" sends every request to the first endpoint while it is
	// healthy: stuck, listed first.
	seq := f.deploy("shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.test"}}}, HealthPath: "/healthz",
			Instances: []storetest.Instance{stuck, live.instance()}},
	})
	f.load()
	f.waitSeq(seq)
	storetest.Eventually(t, 5*time.Second, "both endpoints probed healthy", func() bool {
		r := f.routesOf(t, "web")
		return len(r.Endpoints) == 2 && len(r.SetAside) == 0
	})

	type result struct {
		reply
		err  error
		took time.Duration
	}
	send := func(method, path string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			start := time.Now()
			var body io.Reader // a GET has none: one could not be sent twice
			if method == http.MethodPost {
				body = strings.NewReader("x")
			}
			req, _ := http.NewRequest(method, "http://"+f.gateway+path, body)
			req.Host = "shop.test"
			resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
			if err != nil {
				ch <- result{err: err, took: time.Since(start)}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			ch <- result{reply: reply{status: resp.StatusCode, body: string(b), backend: resp.Header.Get("X-Backend")}, err: err, took: time.Since(start)}
		}()
		return ch
	}
	stream := send(http.MethodGet, "/stream")
	gets := []<-chan result{send(http.MethodGet, "/"), send(http.MethodGet, "/")}
	post := send(http.MethodPost, "/")
	// Let the requests reach stuck and wait there.
	storetest.Eventually(t, 5*time.Second, "the requests to wait on stuck", func() bool {
		a := current.Load()
		return a.health.waiting.waitingOn(net.JoinHostPort(stuck.Address, strconv.Itoa(stuck.Port))) == 3
	})
	failedAt := time.Now()
	fail()

	for i, ch := range gets {
		r := <-ch
		t.Logf("GET %d: %d from %q after %s (%v)", i, r.status, r.backend, r.took.Round(time.Millisecond), r.err)
		if r.err != nil || r.status != 200 || r.backend != "live" {
			t.Errorf("GET %d waiting on the failing endpoint: %d from %q, %v; want 200 from live", i, r.status, r.backend, r.err)
		}
	}
	r := <-post
	t.Logf("POST: %d after %s (%v)", r.status, r.took.Round(time.Millisecond), r.err)
	if r.err != nil || r.status != http.StatusBadGateway {
		t.Errorf("POST waiting on the failing endpoint: %d %v; want 502", r.status, r.err)
	}
	if d := time.Since(failedAt); d > 4*time.Second {
		t.Errorf("abandoning took %s", d)
	}
	if s := <-stream; s.err != nil || s.backend != "stuck" || strings.Count(s.body, "\n") != 30 {
		t.Errorf("the stream from the failing endpoint was cut: %d lines from %q, %v", strings.Count(s.body, "\n"), s.backend, s.err)
	}
}
