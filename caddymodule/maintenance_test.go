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
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// answerBackend answers /s<code> with that status and "instance <code>",
// /slow after a second, anything else 200 "instance ok"; hits counts
// every request it got.
func answerBackend(t *testing.T, hits *atomic.Int64) storetest.Instance {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/s")); err == nil {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(code)
			fmt.Fprintf(w, "instance %d", code)
			return
		}
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		io.WriteString(w, "instance ok")
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: "st1", Machine: "m1", Address: host, Port: port}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) ask(host, path, accept string) answer {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+path, nil)
	req.Host = host
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatalf("GET %s%s: %v", host, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

var testPages = map[int]store.ErrorPage{
	502: {Body: "<h1>502 page</h1>"},
	503: {Body: `{"page":503}`, ContentType: "application/json"},
	504: {Body: "504 page", ContentType: "text/plain; charset=utf-8"},
}

// A route's error pages replace a 502, 503 or 504 whoever gave it: an
// instance's answer (its body dropped, its status kept), the gateway's
// own 503 for a service without instances, the proxy's 502 for an
// instance that refuses connections, its 504 for one too slow; other
// answers pass untouched, and a route without pages keeps the original.
func TestErrorPagesThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	var hits atomic.Int64
	in := answerBackend(t, &hits)
	refused := storetest.Instance{ID: "gone", Machine: "m1", Address: "127.0.0.1", Port: func() int { _, p := splitHostPort(t, freeAddr(t)); return p }()}
	slow := store.RouteTimeouts{ResponseHeader: store.Duration(300 * time.Millisecond)}
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{in}, Routes: []store.Route{
			{Hosts: []string{"pages.example"}, ErrorPages: testPages, Timeouts: &slow},
			{Hosts: []string{"plain.example"}},
		}},
		"empty":   {Routes: []store.Route{{Hosts: []string{"empty.example"}, ErrorPages: testPages}}},
		"refused": {Instances: []storetest.Instance{refused}, Routes: []store.Route{{Hosts: []string{"refused.example"}, ErrorPages: testPages}}},
	}))
	cases := []struct {
		host, path string
		status     int
		ctype      string
		body       string
	}{
		{"pages.example", "/s502", 502, "text/html; charset=utf-8", "<h1>502 page</h1>"},
		{"pages.example", "/s503", 503, "application/json", `{"page":503}`},
		{"pages.example", "/s504", 504, "text/plain; charset=utf-8", "504 page"},
		{"pages.example", "/slow", 504, "text/plain; charset=utf-8", "504 page"},
		{"pages.example", "/s500", 500, "text/plain", "instance 500"},
		{"pages.example", "/s404", 404, "text/plain", "instance 404"},
		{"pages.example", "/", 200, "text/plain; charset=utf-8", "instance ok"},
		{"plain.example", "/s502", 502, "text/plain", "instance 502"},
		{"empty.example", "/", 503, "application/json", `{"page":503}`},
		{"refused.example", "/", 502, "text/html; charset=utf-8", "<h1>502 page</h1>"},
	}
	for _, c := range cases {
		a := f.ask(c.host, c.path, "")
		if a.status != c.status || a.body != c.body || a.header.Get("Content-Type") != c.ctype {
			t.Errorf("%s%s: %d %q %q, want %d %q %q", c.host, c.path, a.status, a.header.Get("Content-Type"), a.body, c.status, c.ctype, c.body)
		}
		if c.body == "<h1>502 page</h1>" && a.header.Get("Content-Length") != strconv.Itoa(len(c.body)) {
			t.Errorf("%s%s: Content-Length %q", c.host, c.path, a.header.Get("Content-Length"))
		}
	}
	// A replaced instance answer keeps its fields that describe no body.
	if a := f.ask("pages.example", "/s503", ""); a.header.Get("Retry-After") != "7" {
		t.Errorf("the instance's Retry-After went: %v", a.header)
	}
}

// Maintenance through a real gateway: a namespace's routes answer 503
// with Retry-After, an HTML page with the message escaped or JSON by
// Accept, and no request reaches the instance; a route with a 503 error
// page answers that page; a service's own off under its namespace's on
// is served; /edgeplane/routes shows it; off serves the instance again.
func TestMaintenanceThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	var hits atomic.Int64
	in := answerBackend(t, &hits)
	f.waitSeq(f.deploy("blog", map[string]storetest.Service{
		"site":  {Instances: []storetest.Instance{in}, Routes: []store.Route{{Hosts: []string{"blog.example"}}}},
		"paged": {Instances: []storetest.Instance{in}, Routes: []store.Route{{Hosts: []string{"paged.example"}, ErrorPages: testPages}}},
		"api":   {Instances: []storetest.Instance{in}, Routes: []store.Route{{Hosts: []string{"api.blog.example"}}}},
	}))
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{in}, Routes: []store.Route{{Hosts: []string{"shop.example"}}}},
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	set := func(rec store.MaintenanceRecord) {
		t.Helper()
		seq, err := f.nats.Store.SetMaintenance(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		f.waitSeq(seq)
	}
	set(store.MaintenanceRecord{Namespace: "blog", On: true, Message: `<script>alert("x")</script> back at 10`, RetryAfter: store.Duration(90 * time.Second)})
	set(store.MaintenanceRecord{Namespace: "blog", Service: "api", On: false})
	before := hits.Load()
	for _, accept := range []string{"", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "*/*"} {
		a := f.ask("blog.example", "/", accept)
		if a.status != 503 || a.header.Get("Retry-After") != "90" || a.header.Get("Content-Type") != "text/html; charset=utf-8" ||
			!strings.Contains(a.body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; back at 10`) || strings.Contains(a.body, "<script>") {
			t.Errorf("Accept %q: %d %v %q", accept, a.status, a.header, a.body)
		}
	}
	for _, accept := range []string{"application/json", "application/json, text/html;q=0.5", "application/problem+json"} {
		a := f.ask("blog.example", "/any/path", accept)
		var got struct {
			Error      string `json:"error"`
			Message    string `json:"message"`
			RetryAfter int    `json:"retry_after"`
		}
		if a.status != 503 || a.header.Get("Retry-After") != "90" || a.header.Get("Content-Type") != "application/json" ||
			json.Unmarshal([]byte(a.body), &got) != nil || got.Error != "maintenance" || got.Message != `<script>alert("x")</script> back at 10` || got.RetryAfter != 90 {
			t.Errorf("Accept %q: %d %v %q", accept, a.status, a.header, a.body)
		}
	}
	if a := f.ask("paged.example", "/", "application/json"); a.status != 503 || a.body != `{"page":503}` || a.header.Get("Retry-After") != "90" {
		t.Errorf("a route with a 503 page under maintenance: %d %v %q", a.status, a.header, a.body)
	}
	if hits.Load() != before {
		t.Errorf("maintenance answers reached the instance: %d requests", hits.Load()-before)
	}
	if a := f.ask("api.blog.example", "/", ""); a.status != 200 || a.body != "instance ok" {
		t.Errorf("blog/api, out of its namespace's maintenance: %d %q", a.status, a.body)
	}
	if a := f.ask("shop.example", "/", ""); a.status != 200 {
		t.Errorf("another namespace: %d %q", a.status, a.body)
	}
	_, body := f.adminGet("/edgeplane/routes")
	var infos []RouteInfo
	if err := json.Unmarshal(body, &infos); err != nil {
		t.Fatal(err)
	}
	for _, ri := range infos {
		under := ri.Namespace == "blog" && ri.Service != "api"
		if (ri.Maintenance != nil) != under || (under && time.Duration(ri.Maintenance.RetryAfter) != 90*time.Second) {
			t.Errorf("/edgeplane/routes %s/%s maintenance %+v", ri.Namespace, ri.Service, ri.Maintenance)
		}
	}
	set(store.MaintenanceRecord{Namespace: "blog", On: false})
	if a := f.ask("blog.example", "/", ""); a.status != 200 || a.body != "instance ok" {
		t.Errorf("after off: %d %q", a.status, a.body)
	}
}

func TestPrefersJSON(t *testing.T) {
	for accept, want := range map[string]bool{
		"": false, "*/*": false, "text/html": false, "application/json": true, "application/json;q=0.5, text/html": false,
		"text/html;q=0.1, application/json": true, "application/vnd.api+json": true,
		"APPLICATION/JSON": true, "application/json;q=0": false, "text/*;q=0.5, application/json;q=0.6": true,
	} {
		if got := prefersJSON(accept); got != want {
			t.Errorf("prefersJSON(%q) = %v, want %v", accept, got, want)
		}
	}
}
