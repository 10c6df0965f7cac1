package integration

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/internal/pebbletest"
	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
)

const offlineApp = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    env: {VERSION: "@V@"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com, fresh.example.com]}]
`

// shippedConfig is the repository's own caddy.json with its ports and paths
// moved for a test (as scripts/up.sh moves them), and its issuer pointed at
// a test CA instead of Let's Encrypt.
func shippedConfig(t *testing.T, dir, natsURL, httpAddr, httpsAddr, adminAddr, dnsAddr string, pb *pebbletest.Server) string {
	t.Helper()
	raw, err := os.ReadFile("../caddy.json")
	if err != nil {
		t.Fatal(err)
	}
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	_, httpsPort, _ := net.SplitHostPort(httpsAddr)
	text := strings.NewReplacer(
		"/var/lib/edgeplane", dir,
		"nats://127.0.0.1:4222", natsURL,
		`":8080"`, `"`+httpAddr+`"`, `: 8080`, `: `+httpPort,
		`":8443"`, `"`+httpsAddr+`"`, `: 8443`, `: `+httpsPort,
		"localhost:2019", adminAddr,
		"127.0.0.1:1053", dnsAddr,
	).Replace(string(raw))
	var cfg map[string]any
	if err := json.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("caddy.json: %v", err)
	}
	tlsApp := cfg["apps"].(map[string]any)["tls"].(map[string]any)
	issuer := tlsApp["automation"].(map[string]any)["policies"].([]any)[0].(map[string]any)["issuers"].([]any)[0].(map[string]any)
	issuer["ca"] = pb.DirectoryURL
	issuer["trusted_roots_pem_files"] = []string{pb.RootCertPath}
	out, _ := json.MarshalIndent(cfg, "", "  ")
	path := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// servedCert is the leaf certificate the gateway at addr presents for sni.
// The chain is Pebble's throwaway CA: only the serial matters here.
func servedCert(addr, sni string) (*x509.Certificate, time.Duration, error) {
	start := time.Now()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true})
	took := time.Since(start)
	if err != nil {
		return nil, took, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], took, nil
}

// meshNode is one meshd process in netstack mode on loopback.
type meshNode struct {
	id, dir string
	proc    *proc
	// bin is another release's meshd in the skew tests; extraBins.meshd
	// when empty.
	bin string
}

func (m *meshNode) binary() string { return cmp.Or(m.bin, extraBins.meshd) }

func (m *meshNode) status(t *testing.T) *node.Status {
	t.Helper()
	out, err := exec.Command(m.binary(), "status", "--data", m.dir, "-o", "json").CombinedOutput()
	if err != nil {
		return nil
	}
	var s node.Status
	if json.Unmarshal(out, &s) != nil {
		return nil
	}
	return &s
}

// handshakeWith reports whether m has completed a handshake with peer after
// since.
func (m *meshNode) handshakeWith(t *testing.T, peer string, since time.Time) bool {
	s := m.status(t)
	if s == nil {
		return false
	}
	for _, p := range s.Peers {
		if p.Machine == peer && p.LastHandshake.After(since) {
			return true
		}
	}
	return false
}

func (c *cluster) startMesh(id string) *meshNode { return c.startMeshBin("", id) }

// startMeshBin is startMesh with meshd binary bin ("" for this tree's).
func (c *cluster) startMeshBin(bin, id string) *meshNode {
	t := c.t
	m := &meshNode{id: id, dir: filepath.Join(c.dir, "mesh-"+id), bin: bin}
	token := strings.TrimSpace(c.mustControl("machine", "invite"))
	if out, err := exec.Command(m.binary(), "join", "--token", token, "--data", m.dir, "--nats", c.url,
		"--machine", id, "--mode", "netstack", "--bind", "127.0.0.1", "--listen-port", "0").CombinedOutput(); err != nil {
		t.Fatalf("meshd join %s: %v\n%s", id, err, out)
	}
	m.run(t, "meshd "+id)
	return m
}

func (m *meshNode) run(t *testing.T, name string) {
	m.proc = start(t, name, nil, m.binary(), "run", "--data", m.dir, "--heartbeat-interval", "1s", "--reconcile-interval", "1s")
}

// An edge box that reboots while the control plane is away still serves:
// the gateway with the repository's own caddy.json (HTTP from its routing
// snapshot, HTTPS with the certificate Pebble issued before the outage, DNS,
// the projection marked stale), the standalone DNS server, and meshd's
// tunnels. A host with no certificate fails fast with store_unavailable and
// costs no ACME order. When the control plane returns, everything
// reconnects by itself: a new deploy is served and a renewal works.
func TestOfflineBootWithTheShippedConfig(t *testing.T) {
	buildExtra(t)
	c := newCluster(t)
	c.join("m1")
	ctx := context.Background()
	c.mustControl("deploy", "apply", "-f", writeApp(t, c.dir, "1"), "--drain-grace", "10ms", "--gateway-wait", "1s")

	httpAddr, httpsAddr, adminAddr, dnsAddr := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	_, httpsPort, _ := net.SplitHostPort(httpsAddr)
	pb := pebbletest.StartFor(t, atoi(httpPort), atoi(httpsPort))
	gwDir := filepath.Join(c.dir, "gw")
	if err := os.MkdirAll(gwDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfgPath := shippedConfig(t, gwDir, c.url, httpAddr, httpsAddr, adminAddr, dnsAddr, pb)
	env := []string{"HOME=" + gwDir, "XDG_DATA_HOME=" + filepath.Join(gwDir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(gwDir, "config")}
	gw := &gateway{http: httpAddr, admin: adminAddr, dns: dnsAddr, dir: gwDir}
	gw.proc = start(t, "caddy", env, extraBins.caddy, "run", "--config", cfgPath)
	eventually(t, 30*time.Second, "the gateway to route shop.example.com", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})
	var issued *x509.Certificate
	eventually(t, 90*time.Second, "an on-demand certificate from Pebble", func() bool {
		cert, _, err := servedCert(httpsAddr, "shop.example.com")
		issued = cert
		return err == nil && slices.Contains(cert.DNSNames, "shop.example.com")
	})
	localCopy := filepath.Join(gwDir, "data", "caddy", "edgeplane", "certs-local-default", "certificates")
	eventually(t, 10*time.Second, "the certificate in the local copy", func() bool {
		m, _ := filepath.Glob(filepath.Join(localCopy, "*", "shop.example.com", "shop.example.com.key"))
		return len(m) == 1
	})
	budgetLink := store.Bound(c.store)
	budget, err := certs.NewBudget(budgetLink, certs.BudgetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before, err := budget.Usage(ctx, "shop.example.com")
	if err != nil || before.Used != 1 {
		t.Fatalf("budget after the first order: %+v, %v", before, err)
	}
	orders := pb.Orders()

	// The standalone DNS server and two meshd nodes, all serving.
	dnsSolo := freeAddr(t)
	startDNS := func(name string) *proc {
		p := start(t, name, nil, extraBins.dns, "--nats", c.url, "--listen", dnsSolo, "--snapshot", filepath.Join(c.dir, "dns-routing.json"))
		p.waitOutput(t, `serving dns`, 20*time.Second)
		return p
	}
	dnsP := startDNS("edgeplane-dns")
	eventually(t, 20*time.Second, "edgeplane-dns to answer", func() bool { return len(dig(t, dnsSolo, "A", "web.shop.edgeplane.internal")) > 0 })
	meshA, meshB := c.startMesh("mesh-a"), c.startMesh("mesh-b")
	for _, m := range []struct {
		n     *meshNode
		other string
	}{{meshA, "mesh-b"}, {meshB, "mesh-a"}} {
		eventually(t, 30*time.Second, m.n.id+"'s tunnel to "+m.other, func() bool { return m.n.handshakeWith(t, m.other, time.Time{}) })
		eventually(t, 20*time.Second, m.n.id+"'s peer cache", func() bool {
			b, err := os.ReadFile(filepath.Join(m.n.dir, "peers.json"))
			return err == nil && strings.Contains(string(b), `"`+m.other+`"`)
		})
	}
	eventually(t, 20*time.Second, "the gateway's snapshot on disk", func() bool {
		_, err := os.Stat(filepath.Join(gwDir, "gateway", "routing.json"))
		return err == nil
	})

	// The control plane goes away (its embedded NATS with it); the box
	// reboots: every process killed and started again.
	natsAddr := strings.TrimPrefix(c.url, "nats://")
	c.server.stop(syscall.SIGKILL)
	gw.proc.stop(syscall.SIGKILL)
	dnsP.stop(syscall.SIGKILL)
	meshA.proc.stop(syscall.SIGKILL)
	restarted := time.Now()
	gw.proc = start(t, "caddy (rebooted, NATS down)", env, extraBins.caddy, "run", "--config", cfgPath)
	startDNS("edgeplane-dns (rebooted, NATS down)")
	meshA.run(t, "meshd mesh-a (rebooted, NATS down)")

	eventually(t, 30*time.Second, "the rebooted gateway to serve HTTP from its snapshot", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})
	cert, took, err := servedCert(httpsAddr, "shop.example.com")
	if err != nil || cert.SerialNumber.Cmp(issued.SerialNumber) != 0 {
		t.Fatalf("HTTPS after an offline reboot: %v (serial %v, want %v)", err, serial(cert), issued.SerialNumber)
	}
	t.Logf("offline reboot: HTTPS for shop.example.com with serial %s, handshake %s", cert.SerialNumber, took.Round(time.Millisecond))
	if got := dig(t, dnsAddr, "A", "web.shop.edgeplane.internal"); len(got) == 0 {
		t.Fatal("the gateway's DNS does not answer after an offline reboot")
	}
	if got := dig(t, dnsSolo, "A", "web.shop.edgeplane.internal"); len(got) == 0 {
		t.Fatal("edgeplane-dns does not answer after an offline reboot")
	}
	if st, err := gw.projection(); err != nil || !st.Stale || st.Connected || st.State != "serving-stale" {
		t.Fatalf("projection after an offline reboot: %+v, %v; want stale", st, err)
	}
	if got := metric(t, adminAddr, "edgeplane_certstore_connected"); got != "0" {
		t.Fatalf("edgeplane_certstore_connected = %q while NATS is down", got)
	}
	eventually(t, 30*time.Second, "mesh-a's tunnel rebuilt from its cache", func() bool {
		s := meshA.status(t)
		return s != nil && s.Control.Source == "cache" && !s.Control.Connected && meshA.handshakeWith(t, "mesh-b", restarted)
	})

	// A host with no certificate: refused fast, and no order is placed.
	_, took, err = servedCert(httpsAddr, "fresh.example.com")
	if err == nil {
		t.Fatal("a certificate was served for fresh.example.com with the store unreachable")
	}
	if took > 5*time.Second {
		t.Fatalf("the on-demand handshake for fresh.example.com failed only after %s", took)
	}
	gw.proc.waitOutput(t, `fresh\.example\.com.*store_unavailable|store_unavailable.*fresh\.example\.com`, 10*time.Second)
	t.Logf("offline on-demand handshake for a host without a certificate failed in %s", took.Round(time.Millisecond))
	if len(lines(gw.proc.output(), "certificate store unreachable")) != 1 {
		t.Fatalf("the outage should be logged once by the storage:\n%s", strings.Join(lines(gw.proc.output(), "certificate store"), "\n"))
	}

	// The control plane returns: everything reconnects by itself.
	c.startServer(natsAddr)
	eventually(t, 30*time.Second, "the gateway to reconnect", func() bool {
		st, err := gw.projection()
		return err == nil && st.Connected && !st.Stale
	})
	eventually(t, 30*time.Second, "the certificate store to reconnect", func() bool {
		return metric(t, adminAddr, "edgeplane_certstore_connected") == "1"
	})
	eventually(t, 30*time.Second, "mesh-a back on the control plane", func() bool {
		s := meshA.status(t)
		return s != nil && s.Control.Connected
	})
	if pb.Orders() != orders {
		t.Fatalf("Pebble saw %d orders during the outage", pb.Orders()-orders)
	}
	// The connection the budget reads through (the test's first, from
	// before the restart) is a client like the others: it reconnects by
	// itself too, within its backoff.
	eventually(t, 30*time.Second, "the budget's connection back on the control plane", func() bool { return budgetLink.Store() != nil })
	if u, err := budget.Usage(ctx, "shop.example.com"); err != nil || u.Used != before.Used {
		t.Fatalf("budget after the outage: %+v, %v; the refused handshake must count nothing", u, err)
	}
	c.waitReachable("m1")
	c.mustControl("deploy", "apply", "-f", writeApp(t, c.dir, "2"), "--drain-grace", "10ms", "--gateway-wait", "5s")
	v2 := map[string]bool{}
	for _, in := range c.instances("shop") {
		if in.Revision == 2 {
			v2[in.ID] = true
		}
	}
	eventually(t, 20*time.Second, "the gateway to serve revision 2", func() bool {
		code, inst, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200 && v2[inst]
	})

	// A renewal works: a forced one, through the fleet's renewal work.
	if err := certs.ScheduleRenewal(ctx, c.store, certs.RenewalItem{Host: "shop.example.com", Force: true, Reason: "manual"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the renewed certificate to be served", func() bool {
		cert, _, err := servedCert(httpsAddr, "shop.example.com")
		return err == nil && cert.SerialNumber.Cmp(issued.SerialNumber) != 0
	})
	if u, err := budget.Usage(ctx, "shop.example.com"); err != nil || u.Used != before.Used+1 {
		t.Fatalf("budget after the renewal: %+v, %v; want one more order", u, err)
	}
}

func writeApp(t *testing.T, dir, version string) string {
	t.Helper()
	body := strings.NewReplacer("@HELLO@", bins.hello, "@V@", version).Replace(offlineApp)
	p := filepath.Join(dir, "offline-v"+version+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func serial(c *x509.Certificate) string {
	if c == nil {
		return "none"
	}
	return c.SerialNumber.String()
}

// metric reads one unlabelled metric from Caddy's admin /metrics.
func metric(t *testing.T, admin, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return fmt.Sprintf("(%s not exported)", name)
}
