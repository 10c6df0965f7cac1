package integration

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// Allow/deny lists and trusted proxies through a real gateway process
// whose server trusts 127.0.0.2 alone (Caddy's trusted_proxies): an
// address inside the allow list passes, one outside is refused 403, a
// spoofed X-Forwarded-For from an untrusted peer is ignored, the trusted
// proxy's is believed and deny wins over allow; redirect_https believes
// the trusted proxy's X-Forwarded-Proto only. A manifest with a bad
// entry is refused with the entry's path and changes nothing.
func TestIPListsThroughGateway(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	g, path, env := c.gatewayConfig("gw1", map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	// As the README's trusted-proxy config: the load balancer's address.
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gw"].(map[string]any)
	srv["trusted_proxies"] = map[string]any{"source": "static", "ranges": []string{"127.0.0.2/32"}}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	g.proc = start(t, "caddy gw1", env, bins.caddy, "run", "--config", path)
	g.waitConnected(t, "gw1")

	c.mustControl("deploy", "apply", "-f", c.manifest("ipl.yaml", iplManifest), "--drain-grace", "100ms")

	direct, proxy, stranger := clientFrom("127.0.0.1"), clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	get := func(cl *http.Client, host string, h map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/", nil)
		req.Host = host
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", host, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	xff := func(ip string) map[string]string { return map[string]string{"X-Forwarded-For": ip} }
	check := func(what string, cl *http.Client, host string, h map[string]string, want int) {
		t.Helper()
		if code, body := get(cl, host, h); code != want {
			t.Errorf("%s: %d %q, want %d", what, code, body, want)
		}
	}
	check("inside allow", direct, "ipl.example.com", nil, 200)
	check("outside allow", stranger, "ipl.example.com", nil, 403)
	check("spoofed X-Forwarded-For from an untrusted peer", stranger, "ipl.example.com", xff("198.51.100.1"), 403)
	check("trusted proxy's X-Forwarded-For believed", proxy, "ipl.example.com", xff("198.51.100.1"), 200)
	check("trusted proxy's client outside allow", proxy, "ipl.example.com", xff("192.0.2.1"), 403)
	check("deny wins over allow", proxy, "ipl.example.com", xff("198.51.100.66"), 403)
	check("IPv6 client of the trusted proxy", proxy, "ipl.example.com", xff("2001:db8::7"), 200)
	https := map[string]string{"X-Forwarded-Proto": "https"}
	check("redirect_https: client on https at the trusted proxy", proxy, "tls.example.com", https, 200)
	check("redirect_https: the trusted proxy's plain request", proxy, "tls.example.com", nil, 308)
	check("redirect_https: an untrusted peer's X-Forwarded-Proto", direct, "tls.example.com", https, 308)
	if code, body := get(stranger, "ipl.example.com", nil); body != "forbidden\n" {
		t.Errorf("refusal body %d %q", code, body)
	}

	// Bad input: refused with the entry's path, nothing written (were the
	// allow-all entry applied, the stranger would pass).
	bad := strings.Replace(iplManifest, "allow: [127.0.0.1, ", "allow: [0.0.0.0/0, 10.1.2.3/8, ", 1)
	out, errOut, code := c.control("deploy", "apply", "-f", c.manifest("bad.yaml", bad))
	if code == 0 || !strings.Contains(out+errOut, "services.web.routes[0].allow[1]") || !strings.Contains(out+errOut, "did you mean 10.0.0.0/8") {
		t.Fatalf("bad allow entry: exit %d\n%s%s", code, out, errOut)
	}
	check("after the refused manifest", stranger, "ipl.example.com", nil, 403)
}

const iplManifest = `
namespace: ipl
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes:
      - hosts: [ipl.example.com]
        allow: [127.0.0.1, 198.51.100.0/24, 2001:db8::/32]
        deny: [198.51.100.66]
      - hosts: [tls.example.com]
        redirect_https: true
`

// clientFrom is a client whose connections leave from the loopback
// address local (all of 127.0.0.0/8 is loopback on Linux), so the
// gateway sees distinct peers; it follows no redirect.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 5 * time.Second,
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
