package caddycerts_test

import (
	"bufio"
	"bytes"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/internal/pebbletest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// TestCaddyGatewaysShareACME runs three processes of edgeplane's custom
// Caddy on one NATS with on-demand TLS (tls.permission.edgeplane), the
// edgeplane storage, issuer and certs app, against a real ACME server
// (Pebble) that validates HTTP-01 through a front port forwarding to the
// gateways.
func TestCaddyGatewaysShareACME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy, control and Pebble processes")
	}
	start := time.Now()
	bins := buildBinaries(t)
	t.Logf("binaries ready in %s", time.Since(start).Round(time.Millisecond))

	srv := storetest.Start(t)
	ctx := context.Background()
	fr := startFront(t, srv.Store)
	pb := pebbletest.Start(t, fr.port())

	// Route the hosts the gateways may get certificates for.
	backend := listenBackend(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": {
			Routes:    []store.Route{{Hosts: []string{"shop.example.com", "www.budget.example.org", "kill.example.com"}}},
			Instances: []storetest.Instance{{ID: "web-1", Machine: "m1", Address: "127.0.0.1", Port: backend}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	gws := make([]*caddyGateway, 3)
	var wg sync.WaitGroup
	for i := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gws[i] = startCaddy(t, bins.caddy, fmt.Sprintf("gw%d", i+1), srv.URL, pb.DirectoryURL, pb.RootCertPath)
		}()
	}
	wg.Wait()
	for _, g := range gws {
		if g == nil {
			t.FailNow()
		}
		fr.add(g)
		g.waitRouted(t, srv.Store, seq)
	}
	t.Logf("three gateways up and routed %s after the start", time.Since(start).Round(time.Millisecond))

	t.Run("many spellings, three gateways, one order", func(t *testing.T) {
		before := pb.Orders()
		// A trailing dot never reaches certmagic: Go's TLS server refuses
		// such a ClientHello (RFC 6066 forbids it) before it asks for a
		// certificate, so it can neither order nor name a lock.
		if err := gws[0].handshakeRawSNI("Shop.example.com."); err == nil || !strings.Contains(err.Error(), "error decoding message") {
			t.Fatalf("handshake with SNI %q: %v; want the server to refuse the ClientHello", "Shop.example.com.", err)
		}
		// A host no route names gets no certificate and no order
		// (tls.permission.edgeplane).
		if _, err := gws[0].handshake("unrouted.example.com"); err == nil {
			t.Fatal("handshake for an unrouted host succeeded")
		}
		spellings := []string{"Shop.Example.com", "shop.example.com", "SHOP.EXAMPLE.COM"}
		leaves := make([]*x509.Certificate, len(gws))
		errs := make([]error, len(gws))
		began := time.Now()
		for i, g := range gws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				leaves[i], errs[i] = g.handshake(spellings[i])
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s, SNI %q: %v", gws[i].name, spellings[i], err)
			}
		}
		t.Logf("three concurrent on-demand handshakes done in %s", time.Since(began).Round(time.Millisecond))
		if n := pb.Orders() - before; n != 1 {
			t.Fatalf("pebble saw %d orders for shop.example.com, want exactly 1", n)
		}
		if fr.crossed.Load() == 0 {
			t.Fatal("no HTTP-01 validation was answered by a gateway other than the one holding the issue lock")
		}
		for i, l := range leaves {
			if !bytes.Equal(l.Raw, leaves[0].Raw) || len(l.DNSNames) != 1 || l.DNSNames[0] != "shop.example.com" {
				t.Fatalf("%s serves %v serial %s; gw1 serves serial %s", gws[i].name, l.DNSNames, l.SerialNumber, leaves[0].SerialNumber)
			}
		}
		// Every gateway serves it again, now from its cache, and no new
		// order is placed.
		for _, g := range gws {
			l, err := g.handshake("shop.example.com")
			if err != nil || !bytes.Equal(l.Raw, leaves[0].Raw) {
				t.Fatalf("%s second handshake: %v", g.name, err)
			}
		}
		if n := pb.Orders() - before; n != 1 {
			t.Fatalf("pebble saw %d orders after the second handshakes, want 1", n)
		}
		// The edgeplane_certs app recorded the certificate and scheduled
		// its renewal.
		var got certs.Status
		storetest.Eventually(t, 10*time.Second, "the obtained certificate in control certs", func() bool {
			for _, s := range bins.controlCerts(t, srv.URL) {
				if s.Host == "shop.example.com" && s.Expiry.Equal(leaves[0].NotAfter) {
					got = s
					return true
				}
			}
			return false
		})
		if got.NextAttempt.IsZero() || got.Issuer == "" || got.LastError != "" || !strings.HasPrefix(got.Gateway, "gw") {
			t.Fatalf("status after obtain: %+v", got)
		}
	})

	t.Run("a forced renewal failure shows in control certs", func(t *testing.T) {
		const host = "shop.example.com"
		fr.mode.Store("refuse")
		defer fr.mode.Store("forward")
		scheduled := time.Now()
		if err := certs.ScheduleRenewal(ctx, srv.Store, certs.RenewalItem{Host: host, Force: true, Reason: "manual"}, scheduled); err != nil {
			t.Fatal(err)
		}
		var failed certs.Status
		storetest.Eventually(t, 60*time.Second, "the failed renewal in control certs", func() bool {
			for _, s := range bins.controlCerts(t, srv.URL) {
				if s.Host == host && s.LastError != "" && s.LastAttempt.After(scheduled) {
					failed = s
					return true
				}
			}
			return false
		})
		if failed.Failures != 1 || !failed.NextAttempt.After(failed.LastAttempt) || !strings.HasPrefix(failed.Gateway, "gw") || failed.Expiry.IsZero() {
			t.Fatalf("failed status %+v: want one failure, a retry, the gateway and the old expiry", failed)
		}
		t.Logf("control certs after the forced renewal failed: gateway=%s failures=%d retry in %s error=%.160s",
			failed.Gateway, failed.Failures, failed.NextAttempt.Sub(failed.LastAttempt).Round(time.Second), failed.LastError)
	})

	t.Run("an order past the fleet budget is refused before the CA sees it", func(t *testing.T) {
		const host = "www.budget.example.org"
		b, err := certs.NewBudget(store.Bound(srv.Store), certs.BudgetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < certs.DefaultBudgetLimit; i++ {
			if _, err := b.Charge(ctx, fmt.Sprintf("h%d.example.org", i)); err != nil {
				t.Fatal(err)
			}
		}
		before := pb.Orders()
		began := time.Now()
		if _, err := gws[1].handshake(host); err == nil {
			t.Fatal("handshake succeeded past the budget")
		}
		if d := time.Since(began); d > 10*time.Second {
			t.Fatalf("the refused handshake took %s: certmagic retried a budget refusal", d)
		}
		var refused certs.Status
		storetest.Eventually(t, 10*time.Second, "the refusal in control certs", func() bool {
			for _, s := range bins.controlCerts(t, srv.URL) {
				if s.Host == host && s.LastErrorCode == certs.CodeBudgetExhausted {
					refused = s
					return true
				}
			}
			return false
		})
		if !strings.Contains(refused.LastError, "example.org") || refused.Gateway != "gw2" {
			t.Fatalf("refusal status %+v: want the domain and the gateway", refused)
		}
		if n := pb.Orders() - before; n != 0 {
			t.Fatalf("pebble saw %d orders past the budget", n)
		}
	})

	// Last: it kills gw1.
	t.Run("the issuing gateway killed mid-order, another finishes after the lease expires", func(t *testing.T) {
		const host = "kill.example.com"
		before := pb.Orders()
		fr.hold()
		gw1done := make(chan error, 1)
		go func() {
			_, err := gws[0].handshake(host)
			gw1done <- err
		}()
		select {
		case <-fr.held: // Pebble is validating gw1's order right now
		case <-time.After(60 * time.Second):
			t.Fatal("no validation reached the challenge port")
		}
		if pid := issueLockHolderPID(srv.Store, host); pid != gws[0].pid {
			t.Fatalf("issue lock of %s held by pid %d, want gw1 (%d)", host, pid, gws[0].pid)
		}
		if err := gws[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-gws[0].exited
		killed := time.Now()
		fr.remove(gws[0])
		fr.release() // the held validation fails: its gateway is gone
		if err := <-gw1done; err == nil {
			t.Fatal("gw1's handshake succeeded though gw1 was killed")
		}
		leaf, err := gws[1].handshake(host)
		if err != nil {
			t.Fatalf("gw2 after gw1 was killed holding the lock: %v", err)
		}
		t.Logf("gw2 served %s %s after gw1 was killed holding its issue lock (lock ttl 2s)", host, time.Since(killed).Round(time.Millisecond))
		if l, err := gws[2].handshake(host); err != nil || !bytes.Equal(l.Raw, leaf.Raw) {
			t.Fatalf("gw3 does not serve gw2's certificate: %v", err)
		}
		if n := pb.Orders() - before; n != 2 {
			t.Fatalf("pebble saw %d orders, want 2 (the abandoned one and the finished one)", n)
		}
	})
	t.Logf("end to end wall time %s", time.Since(start).Round(time.Millisecond))
}

// binaries are the real programs the test runs.
type binaries struct {
	caddy, control string
}

// buildBinaries builds our Caddy and control, or takes prebuilt ones from
// $EDGEPLANE_CADDY_BIN and $EDGEPLANE_CONTROL_BIN.
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := binaries{caddy: os.Getenv("EDGEPLANE_CADDY_BIN"), control: os.Getenv("EDGEPLANE_CONTROL_BIN")}
	build := func(out *string, pkg string) {
		if *out != "" {
			return
		}
		*out = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", *out, pkg)
		cmd.Dir = root
		if o, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, o)
		}
	}
	build(&b.caddy, "./caddymodule/cmd/caddy")
	build(&b.control, "./control")
	return b
}

// controlCerts runs `control certs -o json` against natsURL.
func (b binaries) controlCerts(t *testing.T, natsURL string) []certs.Status {
	t.Helper()
	cmd := exec.Command(b.control, "certs", "-o", "json", "--nats", natsURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("control certs: %v\n%s", err, stderr.Bytes())
	}
	var list []certs.Status
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("control certs -o json: %v\n%s", err, out)
	}
	return list
}

// caddyGateway is one running Caddy process.
type caddyGateway struct {
	name              string
	pid               int
	httpAddr, tlsAddr string
	cmd               *exec.Cmd
	logPath           string
	exited            chan struct{}
}

func startCaddy(t *testing.T, bin, name, natsURL, dirURL, caRoot string) *caddyGateway {
	t.Helper()
	dir := t.TempDir()
	httpPort, tlsPort := freePort(t), freePort(t)
	acme := map[string]any{
		"module": "edgeplane", "ca": dirURL, "test_ca": dirURL, "email": "ops@example.com",
		"trusted_roots_pem_files": []string{caRoot},
		"challenges":              map[string]any{"tls-alpn": map[string]any{"disabled": true}, "bind_host": "127.0.0.1"},
	}
	respond := []any{map[string]any{"handle": []any{map[string]any{"handler": "static_response", "body": name}}}}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "INFO"}}},
		"storage": map[string]any{"module": "edgeplane", "nats_url": natsURL, "lock_ttl": "2s"},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": natsURL, "gateway_name": name,
				"snapshot_path": filepath.Join(dir, "routing.json")},
			"edgeplane_certs": map[string]any{"gateway_name": name, "ack_wait": "30s",
				// No retry of the forced failure within the test.
				"retry_backoff": "10m"},
			"http": map[string]any{
				"http_port": httpPort, "https_port": tlsPort,
				"servers": map[string]any{
					"https": map[string]any{"listen": []string{fmt.Sprintf("127.0.0.1:%d", tlsPort)}, "routes": respond,
						"tls_connection_policies": []any{map[string]any{}},
						"automatic_https":         map[string]any{"disable_redirects": true}},
					"http": map[string]any{"listen": []string{fmt.Sprintf("127.0.0.1:%d", httpPort)}, "routes": respond,
						"automatic_https": map[string]any{"disable_redirects": true}},
				},
			},
			"tls": map[string]any{"automation": map[string]any{
				"policies":  []any{map[string]any{"on_demand": true, "issuers": []any{acme}}},
				"on_demand": map[string]any{"permission": map[string]any{"module": "edgeplane"}},
			}},
		},
	}
	data, _ := json.MarshalIndent(cfg, "", "  ")
	cfgPath := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	g := &caddyGateway{name: name, httpAddr: fmt.Sprintf("127.0.0.1:%d", httpPort), tlsAddr: fmt.Sprintf("127.0.0.1:%d", tlsPort),
		logPath: filepath.Join(dir, "caddy.log"), exited: make(chan struct{})}
	logf, err := os.Create(g.logPath)
	if err != nil {
		t.Fatal(err)
	}
	g.cmd = exec.Command(bin, "run", "--config", cfgPath)
	g.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_CACHE_HOME="+filepath.Join(dir, "cache"))
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.pid = g.cmd.Process.Pid
	go func() { _ = g.cmd.Wait(); logf.Close(); close(g.exited) }()
	t.Cleanup(func() {
		_ = g.cmd.Process.Kill()
		<-g.exited
		if t.Failed() {
			b, _ := os.ReadFile(g.logPath)
			t.Logf("%s log (tail):\n%s", name, tail(string(b), 6000))
		}
	})
	storetest.Eventually(t, 30*time.Second, name+" to listen", func() bool {
		select {
		case <-g.exited:
			b, _ := os.ReadFile(g.logPath)
			t.Fatalf("%s exited:\n%s", name, tail(string(b), 4000))
		default:
		}
		for _, a := range []string{g.httpAddr, g.tlsAddr} {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	})
	return g
}

// waitRouted waits until the gateway's projection reports routing seq
// applied, so its on-demand permission knows the routed hosts.
func (g *caddyGateway) waitRouted(t *testing.T, st *store.Store, seq uint64) {
	t.Helper()
	storetest.Eventually(t, 30*time.Second, g.name+" to apply the routing events", func() bool {
		var obs store.GatewayObservation
		_, err := store.GetJSON(context.Background(), storetest.Bucket(t, st, st.Names.GatewaysBucket()), store.GatewayKey(g.name), &obs)
		return err == nil && obs.AppliedSeq >= seq && !obs.Stale
	})
}

// handshake dials the gateway's TLS port with sni and returns the leaf it
// serves. The first handshake for a name waits for the on-demand order.
func (g *caddyGateway) handshake(sni string) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 60 * time.Second}, "tcp", g.tlsAddr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// handshakeRawSNI sends a ClientHello whose SNI is exactly sni, trailing dot
// included (Go's client strips it): the name goes out with a stand-in last
// byte of the same length, replaced on the wire.
func (g *caddyGateway) handshakeRawSNI(sni string) error {
	standIn := sni[:len(sni)-1] + "x"
	raw, err := net.DialTimeout("tcp", g.tlsAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(30 * time.Second))
	conn := tls.Client(&rewriteConn{Conn: raw, from: []byte(standIn), to: []byte(sni)},
		&tls.Config{ServerName: standIn, InsecureSkipVerify: true})
	return conn.Handshake()
}

// rewriteConn replaces from with to (same length) in what it writes.
type rewriteConn struct {
	net.Conn
	from, to []byte
	done     bool
}

func (c *rewriteConn) Write(p []byte) (int, error) {
	if !c.done {
		if i := bytes.Index(p, c.from); i >= 0 {
			q := append([]byte(nil), p...)
			copy(q[i:], c.to)
			c.done = true
			return c.Conn.Write(q)
		}
	}
	return c.Conn.Write(p)
}

// front is Pebble's HTTP-01 port. It forwards each validation to a gateway
// that does NOT hold the host's issue lock, so a challenge is answered by a
// gateway other than the one that started it; in "refuse" mode it drops
// connections, so validations fail.
type front struct {
	ln      net.Listener
	st      *store.Store
	mode    atomic.Value
	mu      sync.Mutex
	gws     []*caddyGateway
	next    int
	crossed atomic.Int32
	// In "hold" mode a validation is held until release: held is closed
	// when the first one arrives.
	held, released chan struct{}
	heldOnce       *sync.Once
}

// hold makes the next validations wait for release, and then fail.
func (f *front) hold() {
	f.mu.Lock()
	f.held, f.released, f.heldOnce = make(chan struct{}), make(chan struct{}), &sync.Once{}
	f.mu.Unlock()
	f.mode.Store("hold")
}

// release ends hold mode: held validations fail, new ones are forwarded.
func (f *front) release() {
	f.mode.Store("forward")
	f.mu.Lock()
	close(f.released)
	f.mu.Unlock()
}

// remove stops forwarding to g.
func (f *front) remove(g *caddyGateway) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.gws {
		if x == g {
			f.gws = append(f.gws[:i], f.gws[i+1:]...)
			return
		}
	}
}

// issueLockHolderPID is the PID in the holder of host's issue lock, 0 when
// nobody holds it.
func issueLockHolderPID(st *store.Store, host string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	h, err := st.LockHolder(ctx, store.CertLockKey(host))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(h.Holder, ':')
	if i < 0 {
		return 0
	}
	pid, _ := strconv.Atoi(h.Holder[i+1:])
	return pid
}

func startFront(t *testing.T, st *store.Store) *front {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{ln: ln, st: st}
	f.mode.Store("forward")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.handle(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return f
}

func (f *front) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *front) add(g *caddyGateway) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gws = append(f.gws, g)
}

func (f *front) handle(c net.Conn) {
	defer c.Close()
	if f.mode.Load() == "refuse" {
		return
	}
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if f.mode.Load() == "hold" {
		f.mu.Lock()
		held, released, once := f.held, f.released, f.heldOnce
		f.mu.Unlock()
		once.Do(func() { close(held) })
		<-released
		return
	}
	holderPID := issueLockHolderPID(f.st, strings.Split(req.Host, ":")[0])
	f.mu.Lock()
	var target *caddyGateway
	for range f.gws {
		g := f.gws[f.next%len(f.gws)]
		f.next++
		if g.pid != holderPID {
			target = g
			break
		}
	}
	f.mu.Unlock()
	if target == nil {
		return
	}
	if holderPID != 0 {
		f.crossed.Add(1)
	}
	up, err := net.Dial("tcp", target.httpAddr)
	if err != nil {
		return
	}
	defer up.Close()
	if err := req.Write(up); err != nil {
		return
	}
	_, _ = io.Copy(c, up)
}

// listenBackend is the routed service's instance: a loopback port.
func listenBackend(t *testing.T) int {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "backend") })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
