package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// dnsInstance asks l4backend's DNS at addr over network ("udp", "tcp")
// which instance answered.
func dnsInstance(addr, network string) (string, error) {
	m := new(dns.Msg)
	m.SetQuestion("who.l4.test.", dns.TypeTXT)
	r, _, err := (&dns.Client{Net: network, Timeout: time.Second}).Exchange(m, addr)
	if err != nil {
		return "", err
	}
	for _, rr := range r.Answer {
		if txt, ok := rr.(*dns.TXT); ok {
			for _, s := range txt.Txt {
				if id, ok := strings.CutPrefix(s, "instance="); ok {
					return id, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no instance in %v", r.Answer)
}

// testDNSRedeploy redeploys a DNS server of the app's own under queries
// through the gateway's port 5353, over UDP (each from a socket of its
// own) and TCP: every query is answered before, during and after, and the
// new instances answer from the switch on.
func testDNSRedeploy(t *testing.T, c *cluster, gw *l4gateway) {
	addr := gw.at(5353)
	eventually(t, 10*time.Second, "dns to answer through the gateway over udp and tcp", func() bool {
		_, errU := dnsInstance(addr, "udp")
		_, errT := dnsInstance(addr, "tcp")
		return errU == nil && errT == nil
	})
	old := map[string]bool{}
	for _, in := range c.instances("names") {
		old[in.ID] = true
	}
	stop := make(chan struct{})
	query := func(network string) func() outcome {
		return func() outcome {
			o := outcome{start: time.Now(), version: network}
			id, err := dnsInstance(addr, network)
			o.ok, o.instance = err == nil, id
			if err != nil {
				o.err = err.Error()
			}
			time.Sleep(5 * time.Millisecond)
			return o
		}
	}
	udp := timedRequests(3, stop, query("udp"))
	tcp := timedRequests(1, stop, query("tcp"))
	time.Sleep(500 * time.Millisecond)
	c.mustControl("deploy", "apply", "-f", c.l4manifest("names2.yaml", dnsManifest("2")), "--drain-grace", "100ms", "--gateway-wait", "10s")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	now := map[string]bool{}
	for _, in := range c.instances("names") {
		now[in.ID] = true
	}
	for _, net := range []struct {
		name string
		all  []outcome
	}{{"udp", udp()}, {"tcp", tcp()}} {
		var failed, toOld, toNew int
		for _, o := range net.all {
			switch {
			case !o.ok:
				failed++
				if failed <= 5 {
					t.Errorf("%s query failed: %s", net.name, o.err)
				}
			case old[o.instance]:
				toOld++
			case now[o.instance]:
				toNew++
			default:
				t.Errorf("%s query answered by %q, no instance of names", net.name, o.instance)
			}
		}
		t.Logf("dns over %s through a redeploy: %d queries, %d answered by old instances, %d by new, %d failed",
			net.name, len(net.all), toOld, toNew, failed)
		if failed != 0 || toOld == 0 || toNew == 0 {
			t.Errorf("dns over %s: %d failed, %d old, %d new answers", net.name, failed, toOld, toNew)
		}
	}
}

// tlsHello connects to addr with sni and returns the certificate the far
// end presented and its first line.
func tlsHello(addr, sni string) (*x509.Certificate, string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		return nil, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return conn.ConnectionState().PeerCertificates[0], strings.TrimSpace(line), err
}

// httpsGet fetches https://host/ through the gateway's HTTPS port.
func httpsGet(addr, host string) (int, string, *x509.Certificate, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
		},
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + host + "/?format=json")
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.TLS.PeerCertificates[0], nil
}

// testPassthrough: two services terminating TLS themselves behind the
// gateway's HTTPS port, beside shop.example.com which the gateway
// terminates: each client sees its own service's certificate and answer,
// the terminated host serves as before, an unknown name is refused.
func testPassthrough(t *testing.T, c *cluster, gw *l4gateway) {
	ids := map[string]string{}
	for _, in := range c.instances("certs") {
		ids[in.Service] = in.ID
	}
	for _, svc := range []string{"alpha", "beta"} {
		sni := svc + ".l4.test"
		var cert *x509.Certificate
		var line string
		eventually(t, 10*time.Second, sni+" through the gateway's https port", func() bool {
			var err error
			cert, line, err = tlsHello(gw.https, sni)
			return err == nil
		})
		if cert.Subject.CommonName != sni || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "l4backend" {
			t.Errorf("%s: the peer's certificate is %s, not the service's own", sni, cert.Subject)
		}
		if want := "service=" + svc + " instance=" + ids[svc]; line != want {
			t.Errorf("%s answered %q, want %q", sni, line, want)
		}
	}

	code, body, cert, err := httpsGet(gw.https, "shop.example.com")
	shop := c.instances("shop")
	if err != nil || code != 200 || len(shop) != 1 || !strings.Contains(body, shop[0].ID) {
		t.Fatalf("shop.example.com over https beside passthrough: %d %q %v", code, body, err)
	}
	if !strings.Contains(cert.Issuer.CommonName, "Caddy Local Authority") {
		t.Errorf("shop.example.com's certificate is issued by %s, not the gateway's internal CA", cert.Issuer)
	}

	if cert, _, err := tlsHello(gw.https, "nope.l4.test"); err == nil {
		t.Errorf("an unknown server name got a handshake, with certificate %s", cert.Subject)
	} else {
		t.Logf("unknown server name refused: %v", err)
	}

	routes := routesOf(t, gw.gateway)
	for _, want := range []string{"alpha.l4.test", "beta.l4.test", "6379", "5353"} {
		if !strings.Contains(routes, want) {
			t.Errorf("/edgeplane/routes lacks the layer-4 entry %s:\n%s", want, routes)
		}
	}
}

// testLayer4BadInput: manifests the CLI refuses with nothing written (a
// port another namespace owns, a reserved port, a passthrough host that is
// an HTTP host), and a port the gateway cannot bind, reported in its
// observation while every other port and HTTP serve on, and opened once
// it is free.
func testLayer4BadInput(t *testing.T, c *cluster, gw *l4gateway) {
	head := routingHead(t, c)
	for _, bad := range []struct{ name, body, want string }{
		{"owned port", `
namespace: other
services:
  cache:
    command: ["@HELLO@"]
    tcp: [{port: 6379}]
`, "port_owned: port tcp/6379 belongs to namespace kv"},
		{"reserved port", `
namespace: other
services:
  admin:
    command: ["@HELLO@"]
    tcp: [{port: 2019}]
`, "services.admin.tcp[0].port: tcp/2019 is reserved"},
		{"passthrough host another namespace serves over http", `
namespace: other
services:
  steal:
    command: ["@HELLO@"]
    tls_passthrough: {hosts: [shop.example.com]}
`, "host_owned: host shop.example.com belongs to namespace shop"},
		{"passthrough host that is an http host of the manifest", `
namespace: other
services:
  web:
    command: ["@HELLO@"]
    routes: [{hosts: [both.l4.test]}]
  raw:
    command: ["@HELLO@"]
    tls_passthrough: {hosts: [both.l4.test]}
`, "services.raw.tls_passthrough.hosts[0]: host both.l4.test is an HTTP host"},
	} {
		out, errOut, code := c.control("deploy", "apply", "-f", c.manifest("bad.yaml", bad.body), "--gateway-wait", "10s")
		t.Logf("%s: exit %d: %s", bad.name, code, strings.TrimSpace(errOut))
		if code == 0 || !strings.Contains(errOut, bad.want) {
			t.Errorf("%s: exit %d, want an error naming %q\nstdout:\n%s\nstderr:\n%s", bad.name, code, bad.want, out, errOut)
		}
	}
	if h := routingHead(t, c); h != head {
		t.Errorf("refused manifests moved the routing head from %d to %d", head, h)
	}
	if got := c.instances("other"); len(got) != 0 {
		t.Errorf("refused manifests started %d instances", len(got))
	}

	// A port someone else on the box holds.
	taken, err := net.Listen("tcp", gw.at(7000))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c.mustControl("deploy", "apply", "-f", c.manifest("busy.yaml", `
namespace: busy
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    tcp: [{port: 7000}]
`), "--drain-grace", "100ms", "--gateway-wait", "10s")
	var report string
	eventually(t, 10*time.Second, "the gateway to report tcp/7000 unbindable", func() bool {
		o := c.observation(t, "gw1")
		if o == nil {
			return false
		}
		for _, e := range o.L4Errors {
			if e.Port == "tcp/7000" && e.Namespace == "busy" && strings.Contains(e.Error, "address already in use") {
				report = fmt.Sprintf("%+v", e)
				return true
			}
		}
		return false
	})
	t.Logf("the gateway's report: %s", report)
	if st := c.mustControl("status"); !strings.Contains(st, "port tcp/7000 of busy/web not open") || !strings.Contains(st, "address already in use") {
		t.Errorf("control status does not show the port error:\n%s", st)
	}
	// Everything else serves on.
	if _, err := redisOnce(gw.at(6379), 2*time.Second); err != nil {
		t.Errorf("redis with tcp/7000 unbindable: %v", err)
	}
	if _, err := dnsInstance(gw.at(5353), "udp"); err != nil {
		t.Errorf("dns with tcp/7000 unbindable: %v", err)
	}
	if code, _, err := gw.request("shop.example.com", "/"); err != nil || code != 200 {
		t.Errorf("http with tcp/7000 unbindable: %d %v", code, err)
	}
	if _, _, err := tlsHello(gw.https, "alpha.l4.test"); err != nil {
		t.Errorf("passthrough with tcp/7000 unbindable: %v", err)
	}

	// Freed, the port opens (the gateway retries) and the report clears.
	taken.Close()
	busy := c.instances("busy")
	eventually(t, 15*time.Second, "the gateway to open tcp/7000 once free", func() bool {
		body, err := get(t, gw.at(7000))
		return err == nil && len(busy) == 1 && strings.Contains(body, busy[0].ID)
	})
	eventually(t, 10*time.Second, "the port error to leave the gateway's report", func() bool {
		o := c.observation(t, "gw1")
		return o != nil && len(o.L4Errors) == 0
	})
}
