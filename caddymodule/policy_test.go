package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// policyBackend answers with what it received: the path, the X-Env and
// X-Debug request headers and the body's length; /slow after a second,
// /flaky with a 503 on two requests of every three.
func policyBackend(t *testing.T) storetest.Instance {
	t.Helper()
	var flaky atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "backend/1.0")
		body, _ := io.ReadAll(r.Body)
		switch strings.TrimPrefix(r.URL.Path, "/api") {
		case "/slow":
			time.Sleep(time.Second)
		case "/flaky":
			if flaky.Add(1)%3 != 0 {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "try again")
				return
			}
		}
		fmt.Fprintf(w, "path=%s env=%s debug=%s body=%d", r.URL.Path, r.Header.Get("X-Env"), r.Header.Get("X-Debug"), len(body))
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: "p1", Machine: "m1", Address: host, Port: port}
}

// Each policy field through a real gateway: a redirect, a stripped
// prefix, request and response headers, a too-large body refused with
// 413 (with a length and streamed), a response-header timeout answered
// 504, retries on a chosen status for idempotent methods only; a route
// of the same service without policy is untouched.
func TestRoutePolicyThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	f.load()
	in := policyBackend(t)
	hole := blackhole(t)
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"hole": {
		Instances: []storetest.Instance{hole},
		Routes:    []store.Route{{Hosts: []string{"hole.example"}, Timeouts: &store.RouteTimeouts{Connect: store.Duration(300 * time.Millisecond)}}},
	}, "web": {
		Instances: []storetest.Instance{in},
		Routes: []store.Route{
			{Hosts: []string{"plain.example"}, RedirectHTTPS: true},
			{Hosts: []string{"shop.example"}, PathPrefixes: []string{"/api"}, StripPrefix: true,
				RequestHeaders:  &store.HeaderOps{Set: map[string]string{"X-Env": "prod"}, Delete: []string{"X-Debug"}},
				ResponseHeaders: &store.HeaderOps{Set: map[string]string{"X-Frame-Options": "DENY"}, Delete: []string{"Server"}},
				MaxRequestBody:  "1KB",
				Timeouts:        &store.RouteTimeouts{ResponseHeader: store.Duration(300 * time.Millisecond)},
				Retries:         &store.RouteRetries{OnStatus: []int{503}, Max: 2}},
			{Hosts: []string{"shop.example"}},
		},
	}}))
	do := func(method, host, path string, body io.Reader, header http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+f.gateway+path, body)
		req.Host = host
		for k, v := range header {
			req.Header[k] = v
		}
		client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, host, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	t.Run("redirect_https", func(t *testing.T) {
		resp, _ := do("GET", "plain.example", "/a/b?x=1", nil, nil)
		if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "https://plain.example/a/b?x=1" {
			t.Fatalf("redirect: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("strip_prefix and headers", func(t *testing.T) {
		resp, body := do("GET", "shop.example", "/api/users", nil, http.Header{"X-Debug": {"1"}, "X-Env": {"dev"}})
		if resp.StatusCode != 200 || body != "path=/users env=prod debug= body=0" {
			t.Fatalf("through the policy route: %d %q", resp.StatusCode, body)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Server") != "" {
			t.Fatalf("response headers: %v", resp.Header)
		}
		// The route without policy is untouched.
		resp, body = do("GET", "shop.example", "/apix", nil, http.Header{"X-Debug": {"1"}})
		if resp.StatusCode != 200 || body != "path=/apix env= debug=1 body=0" || resp.Header.Get("Server") != "backend/1.0" {
			t.Fatalf("the route without policy: %d %q %v", resp.StatusCode, body, resp.Header)
		}
	})
	t.Run("max_request_body", func(t *testing.T) {
		if resp, body := do("POST", "shop.example", "/api/up", strings.NewReader(strings.Repeat("x", 1000)), nil); resp.StatusCode != 200 || !strings.HasSuffix(body, "body=1000") {
			t.Fatalf("a body under the limit: %d %q", resp.StatusCode, body)
		}
		if resp, _ := do("POST", "shop.example", "/api/up", strings.NewReader(strings.Repeat("x", 2000)), nil); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("a body over the limit with a length: %d", resp.StatusCode)
		}
		// Streamed (chunked): the limit is found while the proxy reads it.
		streamed := io.MultiReader(strings.NewReader(strings.Repeat("x", 1000)), strings.NewReader(strings.Repeat("y", 1000)))
		if resp, _ := do("POST", "shop.example", "/api/up", io.NopCloser(streamed), nil); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("a streamed body over the limit: %d", resp.StatusCode)
		}
	})
	t.Run("timeouts", func(t *testing.T) {
		start := time.Now()
		resp, _ := do("GET", "shop.example", "/api/slow", nil, nil)
		took := time.Since(start)
		if resp.StatusCode != http.StatusGatewayTimeout || took > 900*time.Millisecond {
			t.Fatalf("a response slower than the route's 300ms: %d after %s", resp.StatusCode, took)
		}
		// A connection that is never had: a dial error after 300ms.
		start = time.Now()
		resp, _ = do("GET", "hole.example", "/", nil, nil)
		if took := time.Since(start); resp.StatusCode != http.StatusBadGateway || took > 900*time.Millisecond {
			t.Fatalf("a connect slower than the route's 300ms: %d after %s", resp.StatusCode, took)
		}
		// The route without the timeout waits the second.
		if resp, _ := do("GET", "shop.example", "/slow", nil, nil); resp.StatusCode != 200 {
			t.Fatalf("the route without a timeout: %d", resp.StatusCode)
		}
	})
	t.Run("retries", func(t *testing.T) {
		// Two 503s of every three: a GET is retried to its 200.
		for i := range 6 {
			if resp, body := do("GET", "shop.example", "/api/flaky", nil, nil); resp.StatusCode != 200 || !strings.HasPrefix(body, "path=/flaky") {
				t.Fatalf("GET %d with retries: %d %q", i, resp.StatusCode, body)
			}
		}
		// A POST is not idempotent: the first answer stands.
		fails := 0
		for range 3 {
			if resp, body := do("POST", "shop.example", "/api/flaky", strings.NewReader("x"), nil); resp.StatusCode == http.StatusServiceUnavailable {
				fails++
				if body != "try again\n" {
					t.Fatalf("a POST's 503 body: %q", body)
				}
			}
		}
		if fails != 2 {
			t.Fatalf("POSTs through a route with retries: %d of 3 answered 503, want 2", fails)
		}
		// A PUT with a body is retried with its body.
		if resp, body := do("PUT", "shop.example", "/api/flaky", strings.NewReader("abc"), nil); resp.StatusCode != 200 || !strings.HasSuffix(body, "body=3") {
			t.Fatalf("PUT with retries: %d %q", resp.StatusCode, body)
		}
	})
}

// blackhole is a loopback listener whose accept queue is full: a new
// connection's SYN is dropped, so connecting hangs.
func blackhole(t *testing.T) storetest.Instance {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Fill the queue (backlog 0 holds one), never accepting.
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel accepts connections past a full accept queue; no blackhole to test a connect timeout against")
	}
	return storetest.Instance{ID: "h1", Machine: "m1", Address: "127.0.0.1", Port: port}
}

// A header is put back as it was, whether it has few fields or many.
func TestHeaderMarkRestores(t *testing.T) {
	for _, n := range []int{0, 3, 8, 20} {
		h := http.Header{}
		for i := range n {
			h.Set(fmt.Sprintf("X-F%d", i), "v")
		}
		want := h.Clone()
		var m headerMark
		m.save(h)
		h.Add("X-F0", "upstream")
		h.Set("Server", "upstream")
		h.Del("X-F1")
		m.restore(h)
		if fmt.Sprint(h) != fmt.Sprint(want) {
			t.Fatalf("%d fields: restored %v, want %v", n, h, want)
		}
	}
}

// A policy the gateway cannot build (a record written past validation,
// say by a newer control plane) fails that route's requests with 502 and
// leaves the service's other routes serving.
func TestUnusablePolicyFailsItsRouteOnly(t *testing.T) {
	f := newFixture(t)
	f.load()
	b := newBackend(t, "b1")
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{b.instance()},
		Routes: []store.Route{
			{Hosts: []string{"shop.example"}, PathPrefixes: []string{"/up"}, MaxRequestBody: "lots"},
			{Hosts: []string{"shop.example"}},
		},
	}}))
	if r := f.mustGet("shop.example", "/up"); r.status != http.StatusBadGateway {
		t.Fatalf("a route whose policy cannot be built: %d %q", r.status, r.body)
	}
	if r := f.mustGet("shop.example", "/other"); r.status != 200 || r.backend != "b1" {
		t.Fatalf("the service's other route: %d %q", r.status, r.body)
	}
}
