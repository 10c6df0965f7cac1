package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The set agrees with a plain scan of its prefixes, at range edges,
// across merged and nested entries, both families.
func TestIPSetMatchesPrefixes(t *testing.T) {
	entries := []string{"10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8", "192.0.2.7", "192.0.2.8/31", "0.0.0.0/32",
		"255.255.255.255", "2001:db8::/32", "2001:db8:1::/48", "2001:db9::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", "::/128"}
	s, err := newIPSet(entries)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.v4) != 4 || len(s.v6) != 4 { // 10/8+11/8 and 192.0.2.7+192.0.2.8/31 touch
		t.Fatalf("ranges not merged: %d v4 %v, %d v6", len(s.v4), s.v4, len(s.v6))
	}
	var pfs []netip.Prefix
	for _, e := range entries {
		pf, err := netip.ParsePrefix(e)
		if err != nil {
			a := netip.MustParseAddr(e)
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		pfs = append(pfs, pf)
	}
	for _, q := range []string{"9.255.255.255", "10.0.0.0", "10.255.255.255", "11.255.255.255", "12.0.0.0", "192.0.2.6",
		"192.0.2.7", "192.0.2.9", "192.0.2.10", "0.0.0.0", "0.0.0.1", "255.255.255.254", "255.255.255.255",
		"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::", "2001:db8:ffff::1", "2001:db9::", "2001:db9::1", "2001:db9::2",
		"ffff:ffff:ffff:ffff:ffff:ffff:ffff:feff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::", "::1", "::ffff:10.0.0.1"} {
		a := netip.MustParseAddr(q)
		want := false
		for _, pf := range pfs {
			want = want || pf.Contains(a.Unmap())
		}
		if got := s.contains(a.Unmap()); got != want {
			t.Errorf("%s: in set %v, want %v", q, got, want)
		}
	}
	for _, bad := range []string{"10.0.0.300", "example.com", "fe80::1%eth0", "10.0.0.0/33", ""} {
		if _, err := newIPSet([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fromAddr is a client whose connections leave from the loopback address
// local (127.0.0.0/8 is all loopback on Linux), so the gateway sees
// different peers; it follows no redirect.
func fromAddr(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 5 * time.Second,
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// forwardEcho answers with the forwarding headers it received, as the
// gateway's reverse proxy set them.
func forwardEcho(t *testing.T) storetest.Instance {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "xff=%s proto=%s", r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"))
	}))
	t.Cleanup(srv.Close)
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	return storetest.Instance{ID: "echo", Machine: "m1", Address: host, Port: port}
}

// loadWithServer loads f's config with extra fields in its gateway
// server (trusted_proxies and the like) and more listen addresses.
func loadWithServer(t *testing.T, f *fixture, extra map[string]any, listen ...string) {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(f.config(), &cfg); err != nil {
		t.Fatal(err)
	}
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gateway"].(map[string]any)
	for k, v := range extra {
		srv[k] = v
	}
	srv["listen"] = append([]any{f.gateway}, func() []any {
		var out []any
		for _, l := range listen {
			out = append(out, l)
		}
		return out
	}()...)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, b)
}

// Allow and deny lists and trusted proxies through a real gateway whose
// server trusts 127.0.0.2 alone: an address inside the allow list passes
// and one outside is refused 403; deny wins; IPv6 by peer and by a
// trusted proxy's X-Forwarded-For; an untrusted peer's X-Forwarded-For
// and X-Forwarded-Proto are ignored, the trusted proxy's believed, so
// redirect_https does not redirect what the client sent to the proxy
// over HTTPS.
func TestIPListsAndTrustedProxies(t *testing.T) {
	f := newFixture(t)
	v6 := "[::1]:" + strconv.Itoa(splitPort(t, freeAddr(t)))
	loadWithServer(t, f, map[string]any{
		"trusted_proxies": map[string]any{"source": "static", "ranges": []string{"127.0.0.2/32"}},
	}, v6)
	in := forwardEcho(t)
	f.waitSeq(f.deploy("ipl", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{in},
		Routes: []store.Route{
			{Hosts: []string{"allow.example"}, Allow: []string{"127.0.0.1", "198.51.100.0/24", "2001:db8::/32", "::1"},
				Deny: []string{"198.51.100.66", "2001:db8::bad"}},
			{Hosts: []string{"deny.example"}, Deny: []string{"127.0.0.3", "203.0.113.0/24"}},
			{Hosts: []string{"plain.example"}, RedirectHTTPS: true},
			{Hosts: []string{"guarded.example"}, RedirectHTTPS: true, Allow: []string{"198.51.100.0/24"}},
		},
	}}))
	direct, trusted, other := fromAddr("127.0.0.1"), fromAddr("127.0.0.2"), fromAddr("127.0.0.3")
	do := func(c *http.Client, addr, host string, h map[string]string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/x", nil)
		req.Host = host
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Location")
	}
	xff := func(ip string) map[string]string { return map[string]string{"X-Forwarded-For": ip} }
	cases := []struct {
		name   string
		client *http.Client
		addr   string
		host   string
		header map[string]string
		status int
		body   string
	}{
		{"inside allow", direct, f.gateway, "allow.example", nil, 200, "xff=127.0.0.1 proto=http"},
		{"outside allow", other, f.gateway, "allow.example", nil, 403, "forbidden\n"},
		{"spoofed X-Forwarded-For from an untrusted peer", other, f.gateway, "allow.example", xff("198.51.100.1"), 403, ""},
		{"spoofed X-Forwarded-For cannot evade deny", other, f.gateway, "deny.example", xff("192.0.2.1"), 403, ""},
		{"untrusted peer's X-Forwarded-For replaced upstream", direct, f.gateway, "allow.example", xff("198.51.100.1"), 200, "xff=127.0.0.1 proto=http"},
		{"trusted proxy's X-Forwarded-For believed", trusted, f.gateway, "allow.example", xff("198.51.100.1"), 200, "xff=198.51.100.1, 127.0.0.2 proto=http"},
		{"trusted proxy's client outside allow", trusted, f.gateway, "allow.example", xff("192.0.2.1"), 403, ""},
		{"trusted proxy itself outside allow", trusted, f.gateway, "allow.example", nil, 403, ""},
		{"deny wins over allow", trusted, f.gateway, "allow.example", xff("198.51.100.66"), 403, ""},
		{"IPv6 inside allow by X-Forwarded-For", trusted, f.gateway, "allow.example", xff("2001:db8::1"), 200, ""},
		{"IPv6 denied by X-Forwarded-For", trusted, f.gateway, "allow.example", xff("2001:DB8::BAD"), 403, ""},
		{"IPv6 peer inside allow", fromAddr("::1"), v6, "allow.example", nil, 200, "xff=::1 proto=http"},
		{"IPv6 peer outside deny", fromAddr("::1"), v6, "deny.example", nil, 200, ""},
		{"deny only: other peer", direct, f.gateway, "deny.example", nil, 200, ""},
		{"deny only: denied peer", other, f.gateway, "deny.example", nil, 403, ""},
		{"deny only: trusted proxy's denied client", trusted, f.gateway, "deny.example", xff("203.0.113.5"), 403, ""},
		{"redirect_https behind the trusted proxy, client on https", trusted, f.gateway, "plain.example",
			map[string]string{"X-Forwarded-Proto": "https", "X-Forwarded-For": "192.0.2.1"}, 200, "xff=192.0.2.1, 127.0.0.2 proto=https"},
		{"redirect_https behind the trusted proxy, client on http", trusted, f.gateway, "plain.example",
			map[string]string{"X-Forwarded-Proto": "http"}, 308, ""},
		{"redirect_https behind the trusted proxy, no X-Forwarded-Proto", trusted, f.gateway, "plain.example", nil, 308, ""},
		{"redirect_https: an untrusted peer's X-Forwarded-Proto changes nothing", direct, f.gateway, "plain.example",
			map[string]string{"X-Forwarded-Proto": "https"}, 308, ""},
		{"refused before the redirect", direct, f.gateway, "guarded.example", nil, 403, ""},
		{"allowed, then redirected", trusted, f.gateway, "guarded.example", xff("198.51.100.9"), 308, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body, loc := do(tc.client, tc.addr, tc.host, tc.header)
			if status != tc.status || tc.body != "" && body != tc.body {
				t.Fatalf("%d %q, want %d %q", status, body, tc.status, tc.body)
			}
			if status == 308 && loc != "https://"+tc.host+"/x" {
				t.Fatalf("redirected to %q", loc)
			}
		})
	}
}

// A trusted proxy that appends to the X-Forwarded-For its client sent
// (as most load balancers do) lets that client choose the left-most
// entry, which Caddy reads by default; with trusted_proxies_strict Caddy
// reads from the right, skipping trusted proxies, and the allow list
// judges the address the proxy saw.
func TestIPListWithStrictTrustedProxies(t *testing.T) {
	f := newFixture(t)
	trusted := map[string]any{"trusted_proxies": map[string]any{"source": "static", "ranges": []string{"127.0.0.2/32"}}}
	loadWithServer(t, f, trusted)
	in := forwardEcho(t)
	f.waitSeq(f.deploy("ipl", map[string]storetest.Service{"web": {
		Instances: []storetest.Instance{in},
		Routes:    []store.Route{{Hosts: []string{"allow.example"}, Allow: []string{"198.51.100.0/24"}}},
	}}))
	proxy := fromAddr("127.0.0.2")
	get := func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/", nil)
		req.Host = "allow.example"
		// The client said 198.51.100.1; the proxy saw 192.0.2.1.
		req.Header.Set("X-Forwarded-For", "198.51.100.1, 192.0.2.1")
		resp, err := proxy.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 200 {
		t.Fatalf("left-most entry (Caddy's default): %d, want 200", code)
	}
	trusted["trusted_proxies_strict"] = 1
	loadWithServer(t, f, trusted)
	if code := get(); code != 403 {
		t.Fatalf("strict: the address the proxy saw is outside allow: %d, want 403", code)
	}
}

func splitPort(t *testing.T, addr string) int {
	_, p := splitHostPort(t, addr)
	return p
}
