package integration

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// Authentication through a real gateway, on a manifest applied with
// control: a hash from `control hash-password` (the password on stdin)
// lets the right password through and refuses a wrong one or none with
// the route's realm; forward_auth to a service of the namespace (hello's
// /status/CODE as the auth service) lets a request through on its 200
// and passes its 401 to the client; an auth service that is down is a
// 503. A manifest with a password in clear is refused with its path and
// a pointer to hash-password, and nothing is written.
func TestEdgeAuthThroughGateway(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")

	cmd := exec.Command(bins.control, "hash-password", "--algorithm", "argon2id")
	cmd.Stdin = strings.NewReader("wonderland\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("control hash-password: %v", err)
	}
	hash := strings.TrimSpace(string(out))

	clear := c.manifest("clear.yaml", strings.Replace(edgeAuthManifest, "@HASH@", "wonderland", 1))
	_, errOut, code := c.control("deploy", "apply", "-f", clear)
	if code == 0 || !strings.Contains(errOut, "services.web.routes[0].basic_auth.users[0].hash") || !strings.Contains(errOut, "control hash-password") {
		t.Fatalf("a password in clear: exit %d: %s", code, errOut)
	}
	if got := c.instances("shop"); len(got) != 0 {
		t.Fatalf("a refused manifest started %d instances", len(got))
	}

	c.mustControl("deploy", "apply", "-f", c.manifest("auth.yaml", strings.Replace(strings.Replace(edgeAuthManifest, "@HASH@", hash, 1),
		"@DOWN@", "http://"+freeAddr(t), 1)), "--drain-grace", "100ms")
	do := func(host, user, pw string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+gw.http+"/", nil)
		req.Host = host
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		resp, err := gwClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	for _, tc := range []struct {
		name, host, user, pw string
		want                 int
	}{
		{"basic_auth right password", "secure.example.com", "alice", "wonderland", 200},
		{"basic_auth wrong password", "secure.example.com", "alice", "looking-glass", 401},
		{"basic_auth no credentials", "secure.example.com", "", "", 401},
		{"forward_auth allows", "allowed.example.com", "", "", 200},
		{"forward_auth denies", "denied.example.com", "", "", 401},
		{"auth service down", "down.example.com", "", "", 503},
	} {
		code, h, body := do(tc.host, tc.user, tc.pw)
		if code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, code, body, tc.want)
		}
		if tc.host == "secure.example.com" && code == 401 && h.Get("Www-Authenticate") != `Basic realm="shop staff"` {
			t.Errorf("%s: challenge %q", tc.name, h.Get("Www-Authenticate"))
		}
		if code == 200 && !strings.Contains(body, "web") {
			t.Errorf("%s: answered by %q, not web", tc.name, body)
		}
	}
}

const edgeAuthManifest = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    env: {VERSION: "web"}
    readiness: {path: /healthz, timeout: 10s}
    routes:
      - {hosts: [secure.example.com], basic_auth: {realm: shop staff, users: [{username: alice, hash: '@HASH@'}]}}
      - {hosts: [allowed.example.com], forward_auth: {service: auth, uri: /status/200}}
      - {hosts: [denied.example.com], forward_auth: {service: auth, uri: /status/401}}
      - {hosts: [down.example.com], forward_auth: {url: '@DOWN@', timeout: 1s}}
  auth:
    command: ["@HELLO@"]
    env: {VERSION: "auth"}
    readiness: {path: /healthz, timeout: 10s}
`
