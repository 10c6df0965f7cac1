package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// statusBackend answers /status/<code> with that code and a body of 10
// bytes, and anything else with 200.
func statusBackend(t *testing.T) storetest.Instance {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/cut" {
			// The response begins, then the connection drops.
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "01234")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		if c, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
			code, _ := strconv.Atoi(c)
			w.WriteHeader(code)
		}
		_, _ = io.WriteString(w, "0123456789")
	}))
	t.Cleanup(srv.Close)
	host, port := splitHostPort(t, srv.Listener.Addr().String())
	return storetest.Instance{ID: "st-1", Machine: "m1", Address: host, Port: port}
}

// The gateway counts each routed request against its namespace and
// service: by status class (a 502 from an upstream it cannot reach
// included), bytes both ways, latency; /metrics shows them and the gateway
// reports them to the store, under its own name, every traffic interval.
// Requests no service routes are not counted against any.
func TestTrafficPerService(t *testing.T) {
	inst := statusBackend(t)
	dead := storetest.Instance{ID: "dead-1", Machine: "m1", Address: "127.0.0.1", Port: 1} // nothing listens
	f := newFixture(t)
	f.app = map[string]any{"traffic_interval": "200ms", "disable_health_checks": true}
	seq := f.deploy("shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.test"}}}, Instances: []storetest.Instance{inst}},
		"api": {Routes: []store.Route{{Hosts: []string{"api.shop.test"}}}, Instances: []storetest.Instance{dead}},
	})
	f.load()
	f.waitSeq(seq)

	send := func(host, method, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+f.gateway+path, strings.NewReader(body))
		req.Host = host
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 7; i++ {
		send("shop.test", http.MethodGet, "/", "")
	}
	for i := 0; i < 3; i++ {
		send("shop.test", http.MethodPost, "/status/500", "abcde")
	}
	send("shop.test", http.MethodGet, "/status/404", "")
	// A response cut after its headers counts as what the client was
	// told: 200.
	send("shop.test", http.MethodGet, "/cut", "")
	if code := send("api.shop.test", http.MethodGet, "/", ""); code != http.StatusBadGateway {
		t.Fatalf("a dead upstream answered %d", code)
	}
	send("nope.test", http.MethodGet, "/", "")

	// The cut response ends at the gateway a moment after its client
	// sees it end.
	var body []byte
	storetest.Eventually(t, 5*time.Second, "every request counted and none open", func() bool {
		var code int
		code, body = f.adminGet("/metrics")
		if code != 200 {
			t.Fatalf("metrics: %d", code)
		}
		return strings.Contains(string(body), `edgeplane_service_open_requests{namespace="shop",service="web"} 0`)
	})
	for _, want := range []string{
		`edgeplane_service_requests_total{code_class="2xx",namespace="shop",service="web"} 8`,
		`edgeplane_service_requests_total{code_class="5xx",namespace="shop",service="web"} 3`,
		`edgeplane_service_requests_total{code_class="4xx",namespace="shop",service="web"} 1`,
		`edgeplane_service_requests_total{code_class="5xx",namespace="shop",service="api"} 1`,
		`edgeplane_service_request_bytes_total{namespace="shop",service="web"} 15`,
		`edgeplane_service_response_bytes_total{namespace="shop",service="web"} 115`,
		`edgeplane_service_request_duration_seconds_count{namespace="shop",service="web"} 12`,
		`edgeplane_service_open_requests{namespace="shop",service="web"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(body), "nope.test") {
		t.Error("an unrouted host became a label")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rep store.GatewayTraffic
	gatewayTraffic := storetest.Bucket(t, f.nats.Store, f.nats.Store.Names.GatewayTrafficBucket())
	storetest.Eventually(t, 10*time.Second, "the gateway's traffic report", func() bool {
		ent, err := gatewayTraffic.Get(ctx, store.GatewayKey("gw-test"))
		if err != nil {
			return false
		}
		rep = store.GatewayTraffic{}
		if err := store.DecodeKeyed(gatewayTraffic.Bucket(), ent.Key(), ent.Value(), &rep); err != nil {
			t.Fatal(err)
		}
		return len(rep.Services) == 2
	})
	// Busiest first.
	web := rep.Services[0]
	if got := fmt.Sprint(web.Namespace, "/", web.Service, " ", web.Classes, " ", web.BytesIn, " ", web.BytesOut); got != "shop/web [0 8 0 1 3] 15 115" {
		t.Errorf("web in the report: %s", got)
	}
	if rep.Since.IsZero() || rep.At.Before(rep.Since) {
		t.Errorf("report times: since %s at %s", rep.Since, rep.At)
	}
}

// The request body bytes a handler reads are counted whether the body's
// length was given or it came chunked (length unknown); a request of
// length 0 counts none.
func TestServeCountsRequestBodies(t *testing.T) {
	c := &serviceCounters{}
	readAll := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, err := io.Copy(io.Discard, r.Body)
		return err
	})
	for _, tc := range []struct {
		name    string
		length  int64
		chunked bool
		body    string
		want    uint64
	}{
		{"length given", 5, false, "abcde", 5},
		{"chunked", -1, true, "abcdefg", 7},
		{"length 0", 0, false, "", 0},
	} {
		before := c.bytesIn.Load()
		r := httptest.NewRequest(http.MethodPost, "http://web.test/", io.NopCloser(strings.NewReader(tc.body)))
		r.ContentLength = tc.length
		if tc.chunked {
			r.TransferEncoding = []string{"chunked"}
		}
		var mw caddyhttp.MiddlewareHandler = middlewareOf(readAll)
		if err := c.serve(httptest.NewRecorder(), r, mw, readAll, unsplit, accessRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := c.bytesIn.Load() - before; got != tc.want {
			t.Errorf("%s: %d request bytes counted, want %d", tc.name, got, tc.want)
		}
	}
}

// middlewareOf is h as a middleware that ends the chain.
type middlewareOf caddyhttp.HandlerFunc

func (m middlewareOf) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	return caddyhttp.HandlerFunc(m)(w, r)
}
