package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Layer 4 through real gateways: a real Redis behind a gateway's TCP port
// through a redeploy and a frozen machine, DNS through its UDP port, TLS
// passthrough by SNI beside a host the gateway terminates, and bad input.
// One cluster (two machines beating every second, one gateway) serves
// every subtest: the scenarios use namespaces of their own.
func TestLayer4ThroughGateway(t *testing.T) {
	needTool(t, "redis-server", "redis-benchmark")
	c := newCluster(t)
	// Beats every second: a frozen machine is judged stale 3 s in.
	c.agentArgs = []string{"--heartbeat", "1s"}
	c.join("m1")
	c.join("m2")
	gw := c.startL4Gateway("gw1", true)
	for _, m := range []struct{ name, body string }{
		{"kv.yaml", redisManifest("1")}, {"names.yaml", dnsManifest("1")},
		{"certs.yaml", passthroughManifest}, {"shop.yaml", httpsShopManifest},
	} {
		c.mustControl("deploy", "apply", "-f", c.l4manifest(m.name, m.body), "--drain-grace", "100ms", "--gateway-wait", "10s")
	}

	t.Run("redis through a redeploy", func(t *testing.T) { testRedisRedeploy(t, c, gw) })
	t.Run("dns over udp through a redeploy", func(t *testing.T) { testDNSRedeploy(t, c, gw) })
	t.Run("tls passthrough by sni", func(t *testing.T) { testPassthrough(t, c, gw) })
	t.Run("bad input", func(t *testing.T) { testLayer4BadInput(t, c, gw) })
	// Last: it freezes m2 (thawed at its end).
	t.Run("frozen machine under load", func(t *testing.T) { testRedisFrozenMachine(t, c, gw) })
}

// needTool skips (fails in CI) when a real peer the test drives is missing.
func needTool(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; scripts/test-deps.sh installs it", tool)
			}
			t.Skipf("%s is not installed (scripts/test-deps.sh installs it as root)", tool)
		}
	}
}

// Redis as a process service: the agent gives it HOST and PORT, its
// readiness is a TCP connect. drain_timeout is short so that a test sees
// a drained connection end.
func redisManifest(version string) string {
	return `
namespace: kv
services:
  redis:
    command: ["/bin/sh", "-c", 'exec redis-server --port "$PORT" --bind "$HOST" --protected-mode no --save "" --appendonly no']
    replicas: 2
    env: {VERSION: "` + version + `"}
    readiness: {timeout: 10s}
    tcp: [{port: 6379}]
    drain_timeout: 4s
`
}

// dnsManifest is l4backend's DNS on the gateway's port 5353 over UDP and
// TCP (its readiness is a TCP connect).
func dnsManifest(version string) string {
	return `
namespace: names
services:
  dns:
    command: ["@L4BACKEND@", "dns"]
    replicas: 2
    env: {VERSION: "` + version + `"}
    readiness: {timeout: 10s}
    udp: [{port: 5353}]
    tcp: [{port: 5353}]
    drain_timeout: 2s
`
}

// Two services terminating TLS themselves, each with a certificate of its
// own, behind the gateway's HTTPS port.
const passthroughManifest = `
namespace: certs
services:
  alpha:
    command: ["@L4BACKEND@", "tls", "alpha.l4.test"]
    env: {SERVICE: alpha}
    readiness: {timeout: 10s}
    tls_passthrough: {hosts: [alpha.l4.test]}
  beta:
    command: ["@L4BACKEND@", "tls", "beta.l4.test"]
    env: {SERVICE: beta}
    readiness: {timeout: 10s}
    tls_passthrough: {hosts: [beta.l4.test]}
`

// The host the gateway terminates TLS for itself, on the same port.
const httpsShopManifest = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`

var l4backendOnce struct {
	sync.Once
	bin string
	err error
}

// l4backend builds the layer-4 tests' backend once per run.
func l4backend(t *testing.T) string {
	t.Helper()
	l4backendOnce.Do(func() {
		bin := filepath.Join(bins.dir, "l4backend")
		out, err := exec.Command("go", "build", "-o", bin, "./testdata/l4backend").CombinedOutput()
		if err != nil {
			l4backendOnce.err = fmt.Errorf("building l4backend: %v\n%s", err, out)
		}
		l4backendOnce.bin = bin
	})
	if l4backendOnce.err != nil {
		t.Fatal(l4backendOnce.err)
	}
	return l4backendOnce.bin
}

// l4manifest is manifest with @L4BACKEND@ standing for the backend.
func (c *cluster) l4manifest(name, body string) string {
	c.t.Helper()
	if strings.Contains(body, "@L4BACKEND@") {
		body = strings.ReplaceAll(body, "@L4BACKEND@", l4backend(c.t))
	}
	return c.manifest(name, body)
}

// l4gateway is a gateway with layer 4: its ports open on bind, its HTTPS
// server (https) routes passthrough hosts by SNI beside the hosts it
// terminates with certificates of Caddy's internal CA.
type l4gateway struct {
	*gateway
	bind string
}

// at is the gateway's layer-4 address for port.
func (g *l4gateway) at(port int) string { return net.JoinHostPort(g.bind, strconv.Itoa(port)) }

// l4BindAddr is a loopback address of the test's own (127.41.x.y), so
// that fixed ports (6379, 5353) collide with nothing else on the box.
func l4BindAddr() string {
	return fmt.Sprintf("127.41.%d.%d", 1+rand.IntN(254), 1+rand.IntN(254))
}

// startL4Gateway starts a gateway as gatewayConfig writes it plus an
// HTTPS server terminating shop.example.com, and layer 4: with layer4 its
// ports bind on an address of their own and the HTTPS server carries the
// passthrough listener wrapper; without, disable_layer4 and no wrapper
// (bench-l4's baseline).
func (c *cluster) startL4Gateway(name string, layer4 bool) *l4gateway {
	t := c.t
	t.Helper()
	g, path, env := c.gatewayConfig(name, map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	lg := &l4gateway{gateway: g, bind: l4BindAddr()}
	g.https = freeAddr(t)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	apps := cfg["apps"].(map[string]any)
	edgeplane := apps["edgeplane"].(map[string]any)
	httpApp := apps["http"].(map[string]any)
	_, httpsPort, _ := net.SplitHostPort(g.https)
	httpApp["https_port"] = atoi(httpsPort)
	https := map[string]any{
		"listen":                  []string{g.https},
		"tls_connection_policies": []any{map[string]any{}},
		"automatic_https":         map[string]any{"disable": true},
		"routes":                  []any{map[string]any{"handle": []any{map[string]any{"handler": "edgeplane"}}}},
	}
	if layer4 {
		edgeplane["layer4_bind"] = lg.bind
		// As the README's passthrough config: passthrough hosts' ClientHellos
		// go to the edgeplane layer-4 handler unterminated; everything else
		// falls through to Caddy's TLS.
		https["listener_wrappers"] = []any{
			map[string]any{"wrapper": "layer4", "routes": []any{map[string]any{
				"match":  []any{map[string]any{"tls": map[string]any{"edgeplane_passthrough": map[string]any{}}}},
				"handle": []any{map[string]any{"handler": "edgeplane"}},
			}}},
			map[string]any{"wrapper": "tls"},
		}
	} else {
		edgeplane["disable_layer4"] = true
	}
	httpApp["servers"].(map[string]any)["gws"] = https
	apps["pki"] = map[string]any{"certificate_authorities": map[string]any{"local": map[string]any{"install_trust": false}}}
	apps["tls"] = map[string]any{
		"certificates": map[string]any{"automate": []string{"shop.example.com"}},
		"automation": map[string]any{"policies": []any{map[string]any{
			"subjects": []string{"shop.example.com"}, "issuers": []any{map[string]any{"module": "internal"}},
		}}},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	g.proc = start(t, "caddy "+name, env, bins.caddy, "run", "--config", path)
	g.waitConnected(t, name)
	return lg
}

// observation is the gateway's latest observation in the store.
func (c *cluster) observation(t *testing.T, gateway string) *store.GatewayObservation {
	t.Helper()
	var found *store.GatewayObservation
	err := c.store.ListGatewayObservations(context.Background(), func(o *store.GatewayObservation) error {
		if o.Gateway == gateway {
			found = o
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// respConn is a Redis connection speaking RESP, enough for inline
// commands and their replies.
type respConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRedis(addr string, timeout time.Duration) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &respConn{Conn: c, r: bufio.NewReader(c)}, nil
}

// do sends an inline command and returns its reply, an array's elements
// joined by spaces; an error reply is an error.
func (c *respConn) do(cmd string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	return c.reply()
}

func (c *respConn) reply() (string, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch body := line[1:]; line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, n)
		for i := 0; i < n; i++ {
			p, err := c.reply()
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, " "), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// redisPort is the port of the Redis instance a connection reached: the
// instance's own (its PORT), which names it among the service's instances.
func (c *respConn) redisPort(timeout time.Duration) (int, error) {
	r, err := c.do("CONFIG GET port", timeout)
	if err != nil {
		return 0, err
	}
	_, p, _ := strings.Cut(r, " ")
	return strconv.Atoi(p)
}

// redisOnce opens a connection to addr, asks which instance it reached
// and closes it: a new connection's whole life through the gateway.
func redisOnce(addr string, timeout time.Duration) (int, error) {
	c, err := dialRedis(addr, timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.redisPort(timeout)
}

// instancesByPort maps ns's instances by their port.
func (c *cluster) instancesByPort(ns string) map[int]store.InstanceRecord {
	c.t.Helper()
	out := map[int]store.InstanceRecord{}
	for _, in := range c.instances(ns) {
		out[in.Port] = in
	}
	return out
}
