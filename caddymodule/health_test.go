package caddymodule

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
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

	// Thawed, it passes its next probe and gets requests again, with no
	// deploy.
	thaw()
	storetest.Eventually(t, 5*time.Second, "the thawed endpoint to serve again", func() bool {
		r, err := f.get("shop.test", "/")
		return err == nil && r.backend == "frozen" && len(f.routesOf(t, "web").SetAside) == 0
	})
}
