package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// What crosses the wire between boxes and storage nodes: with credentials
// on, nothing a box says or fetches is readable on the way, and nothing is
// said to a server that did not prove itself under the fleet CA.

// TestWirePortsRefusePlaintextAndForeignCA runs three storage nodes in
// network namespaces. Their client and route ports answer a plaintext
// client with nothing at all (TLS from the first byte); and a fourth node
// holding
// the same operator keys and cluster secret but a CA of its own is refused
// by every route, so the cluster stays the three nodes.
func TestWirePortsRefusePlaintextAndForeignCA(t *testing.T) {
	sc := newStorageCluster(t)
	for i := 1; i <= 3; i++ {
		client := sc.lab.addr(i) + ":4222"
		if got := plaintextExchange(t, client); len(got) > 0 {
			t.Errorf("client port %s answered a plaintext client: %q", client, got)
		}
		route := sc.lab.addr(i) + ":6222"
		if got := plaintextExchange(t, route); len(got) > 0 {
			t.Errorf("route port %s answered a plaintext client: %q", route, got)
		}
	}

	// The intruder: a copy of the auth dir with another CA in it.
	foreign := filepath.Join(sc.dir, "foreign-auth")
	run(t, "cp", "-a", filepath.Join(sc.dir, "auth"), foreign)
	if err := os.RemoveAll(filepath.Join(foreign, "tls")); err != nil {
		t.Fatal(err)
	}
	if _, err := storagenode.InitFleetTLS(foreign, nil); err != nil {
		t.Fatal(err)
	}
	// The worst case: it trusts the fleet's CA too, so it accepts the
	// nodes' certificates, and only the nodes' check of its own stops it.
	fleetCA, err := os.ReadFile(filepath.Join(sc.dir, "auth", "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(foreign, "tls", "bundle.crt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(fleetCA); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var routes []string
	for i := 1; i <= 3; i++ {
		routes = append(routes, sc.lab.addr(i)+":6222")
	}
	host := sc.lab.subnet + ".254"
	intruder := start(t, "storage node s4 (another CA)", nil, bins.control, "server",
		"--data", filepath.Join(sc.dir, "s4"), "--listen", host+":0", "--name", "s4", "--cluster-name", "edge",
		"--cluster-listen", host+":16222", "--routes", strings.Join(routes, ","),
		"--auth", "on", "--auth-dir", foreign, "--stun-listen", "", "--enroll-listen", "", "--nats-logs")
	// Its routes get through its own side of the handshake (it trusts the
	// nodes' CA) and each node closes them, again and again: a node does
	// not accept its certificate.
	eventually(t, 30*time.Second, "the intruder's routes to be refused", func() bool {
		return len(lines(intruder.output(), "Router connection closed")) >= 6
	})
	t.Logf("s4: %s", lines(intruder.output(), "Router connection closed")[0])
	out, errOut, code := sc.control(1, "storage", "ls", "-o", "json")
	if code != 0 {
		t.Fatalf("storage ls: %d\n%s\n%s", code, out, errOut)
	}
	var view struct {
		Nodes []struct {
			Name string `json:"name"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &view); err != nil {
		t.Fatalf("storage ls json: %v\n%s", err, out)
	}
	var names []string
	for _, n := range view.Nodes {
		names = append(names, n.Name)
	}
	if strings.Join(names, ",") != "s1,s2,s3" {
		t.Fatalf("the cluster is %v, want s1,s2,s3: the node of another CA got in\n%s", names, out)
	}
}

// plaintextExchange speaks plaintext NATS to addr and returns whatever
// came back. Both ports of a node with credentials do TLS first: they wait
// for a ClientHello, say nothing (not even INFO), and end a connection
// that sends anything else.
func plaintextExchange(t *testing.T, addr string) []byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	if b, err := r.Peek(1); err == nil {
		return b
	}
	if _, err := conn.Write([]byte("CONNECT {\"verbose\":true}\r\nPING\r\n")); err != nil {
		return nil // refused already
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(r)
	// A TLS alert is no answer a NATS client can use.
	if len(b) > 0 && b[0] == 0x15 {
		return nil
	}
	return b
}

// TestWireCaptureHoldsNoSecrets captures the veth of a storage node in its
// own namespace while an agent (root namespace) starts an instance with a
// secret in its environment and two gateways issue and then load a
// certificate through the store. Neither a private key, nor any JWT or nkey
// seed of the credentials in use, nor the secret appears in the capture,
// while the second gateway demonstrably got the first one's key over it.
func TestWireCaptureHoldsNoSecrets(t *testing.T) {
	buildExtra(t)
	lab := newNetLab(t, 1)
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Fatal("tcpdump is not installed (scripts/test-deps.sh installs it)")
	}
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, netns: lab.ns[0]}
	t.Cleanup(c.killInstances)
	pcap := filepath.Join(c.dir, "wire.pcap")
	dump := start(t, "tcpdump", nil, "tcpdump", "-i", "epv"+lab.id+"1", "-n", "-s", "0", "-U", "-w", pcap, "tcp")
	dump.waitOutput(t, `listening on`, 10*time.Second)

	c.startServer(lab.addr(1) + ":4222")
	if !strings.Contains(c.server.output(), "tls://"+lab.addr(1)) {
		t.Fatalf("the storage node does not speak TLS:\n%s", c.server.output())
	}
	c.join("m1", "--address", "127.0.0.1")
	gwCreds := c.issueCreds(storagenode.RoleGateway, "gw1")
	gw1 := startEdgeGateway(t, c, "gw1", c.url, gwCreds)

	var raw [12]byte
	_, _ = rand.Read(raw[:])
	secret := "secret-" + hex.EncodeToString(raw[:])
	manifest := strings.Replace(helloV1, `env: {VERSION: "1"}`, `env: {VERSION: "1", API_TOKEN: "`+secret+`"}`, 1)
	c.mustControl("deploy", "apply", "-f", c.manifest("secret.yaml", manifest), "--gateway-wait", "10s")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool {
		code, _, err := gw1.request("shop.example.com", "/")
		return err == nil && code == 200
	})

	// gw1 issues shop.example.com's certificate and stores it; gw2, with
	// nothing of its own, loads the same one from the store.
	first := servedFingerprint(t, gw1.https, "shop.example.com")
	gw2 := startEdgeGateway(t, c, "gw2", c.url, c.issueCreds(storagenode.RoleGateway, "gw2"))
	if second := servedFingerprint(t, gw2.https, "shop.example.com"); second != first {
		t.Fatalf("gw2 serves certificate %s, gw1 %s: gw2 did not load it from the store", second, first)
	}
	keyLines := pemBodyLines(t, gw1.dir, ".key")

	dump.stop(syscall.SIGINT)
	capture, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	summary, err := exec.Command("tcpdump", "-r", pcap, "-n", "tcp port 4222 and greater 200").Output()
	if err != nil {
		t.Fatalf("reading the capture: %v", err)
	}
	packets := strings.Count(string(summary), "\n")
	t.Logf("capture: %d bytes, %d data packets on port 4222", len(capture), packets)
	if packets < 50 {
		t.Fatalf("the capture holds %d data packets on port 4222: it did not see the traffic", packets)
	}

	forbidden := map[string]string{"PRIVATE KEY": "a PEM private key", secret: "the manifest's secret"}
	for i, l := range keyLines {
		forbidden[l] = fmt.Sprintf("line %d of the certificate's private key", i+1)
	}
	for _, f := range []string{c.creds, filepath.Join(c.dir, "agent-m1.creds"), gwCreds} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		token, err := jwt.ParseDecoratedJWT(b)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := jwt.ParseDecoratedNKey(b)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		parts := strings.Split(token, ".")
		forbidden[token] = "the JWT of " + filepath.Base(f)
		forbidden[parts[1]] = "the claims of the JWT of " + filepath.Base(f)
		forbidden[string(seed)] = "the nkey seed of " + filepath.Base(f)
	}
	for s, what := range forbidden {
		if bytes.Contains(capture, []byte(s)) {
			t.Errorf("the capture holds %s", what)
		}
	}
}

// servedFingerprint waits for a gateway to serve a certificate for host
// and returns its SHA-256 fingerprint.
func servedFingerprint(t *testing.T, addr, host string) string {
	t.Helper()
	var fp string
	eventually(t, 30*time.Second, "a certificate for "+host+" at "+addr, func() bool {
		cert, _, err := servedCert(addr, host)
		if err == nil {
			fp = pki.Fingerprint(cert)
		}
		return err == nil
	})
	return fp
}

// pemBodyLines returns the base64 lines of the PEM files named *suffix
// under dir (the gateway's local copy of what it stores).
func pemBodyLines(t *testing.T, dir, suffix string) []string {
	t.Helper()
	var out []string
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || !strings.HasSuffix(p, suffix) {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, l := range strings.Split(string(b), "\n") {
			if len(l) >= 48 && !strings.HasPrefix(l, "-----") {
				out = append(out, l)
			}
		}
		return nil
	})
	if len(out) == 0 {
		t.Fatalf("no private key (%s) under %s", suffix, dir)
	}
	return out
}

// middle is a TCP proxy between a client and a storage node. Honest, it
// passes bytes through (TLS stays end to end); hostile, it terminates TLS
// with a certificate of its own (under a CA named like the fleet's) and
// keeps whatever the client sends it after the handshake.
type middle struct {
	ln      net.Listener
	target  string
	cert    tls.Certificate
	hostile atomic.Bool

	mu         sync.Mutex
	conns      []net.Conn
	handshakes []string // how each hostile handshake ended
	plaintext  bytes.Buffer
}

func newMiddle(t *testing.T, target string) *middle {
	t.Helper()
	ca, err := pki.NewCA("edgeplane fleet CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.IssueServer(key.Public(), pki.ServerRequest{Name: "edgeplane", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &middle{ln: ln, target: target, cert: tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}}
	t.Cleanup(func() {
		ln.Close()
		m.drop()
	})
	go m.serve()
	return m
}

func (m *middle) addr() string { return m.ln.Addr().String() }

func (m *middle) serve() {
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			return
		}
		m.mu.Lock()
		m.conns = append(m.conns, conn)
		m.mu.Unlock()
		if m.hostile.Load() {
			go m.terminate(conn)
		} else {
			go m.pass(conn)
		}
	}
}

func (m *middle) pass(conn net.Conn) {
	up, err := net.Dial("tcp", m.target)
	if err != nil {
		conn.Close()
		return
	}
	m.mu.Lock()
	m.conns = append(m.conns, up)
	m.mu.Unlock()
	go func() { _, _ = io.Copy(up, conn); up.Close() }()
	_, _ = io.Copy(conn, up)
	conn.Close()
}

func (m *middle) terminate(conn net.Conn) {
	tc := tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{m.cert}})
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	err := tc.Handshake()
	m.mu.Lock()
	m.handshakes = append(m.handshakes, fmt.Sprint(err))
	m.mu.Unlock()
	if err != nil {
		return
	}
	b, _ := io.ReadAll(tc)
	m.mu.Lock()
	m.plaintext.Write(b)
	m.mu.Unlock()
}

// drop closes every connection through the middle.
func (m *middle) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		c.Close()
	}
	m.conns = nil
}

func (m *middle) seen() ([]string, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.handshakes...), m.plaintext.Len()
}

// TestWireHostileMiddle puts a proxy between a gateway and its storage
// node. Passing bytes through, it changes nothing; once it terminates TLS
// with a certificate of its own, the gateway's reconnects are refused at
// the handshake (the gateway says why), the gateway keeps serving what it
// last knew, and the proxy receives not one byte of what the gateway would
// have said. Honest again, the gateway reconnects by itself.
func TestWireHostileMiddle(t *testing.T) {
	buildExtra(t)
	c := newAuthCluster(t)
	c.join("m1")
	m := newMiddle(t, strings.TrimPrefix(c.url, "nats://"))
	gw := startEdgeGateway(t, c, "gw1", "tls://"+m.addr(), c.issueCreds(storagenode.RoleGateway, "gw1"))
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--gateway-wait", "10s")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})

	m.hostile.Store(true)
	m.drop()
	eventually(t, 15*time.Second, "the gateway to see the store is gone", func() bool {
		st, err := gw.projection()
		return err == nil && !st.Connected
	})
	eventually(t, 15*time.Second, "the gateway to have been refused by the middle", func() bool {
		hs, _ := m.seen()
		return len(hs) >= 2
	})
	why := "not issued under the fleet CA"
	eventually(t, 15*time.Second, "the gateway to say why it does not connect", func() bool {
		st, err := gw.projection()
		return err == nil && strings.Contains(st.LastError, why) && strings.Contains(gw.proc.output(), why)
	})
	for i := 0; i < 20; i++ {
		if code, body, err := gw.request("shop.example.com", "/"); err != nil || code != 200 {
			t.Fatalf("the gateway stopped serving its last good state: %d %s %v", code, body, err)
		}
	}
	hs, plain := m.seen()
	for _, h := range hs {
		if h == "<nil>" {
			t.Errorf("a TLS handshake with the hostile middle succeeded")
		}
	}
	if plain > 0 {
		t.Fatalf("the gateway sent %d bytes to the hostile middle", plain)
	}
	st, _ := gw.projection()
	t.Logf("handshakes refused: %d (%s); gateway: %s", len(hs), hs[0], st.LastError)

	m.hostile.Store(false)
	m.drop()
	eventually(t, 20*time.Second, "the gateway to reconnect through the honest middle", func() bool {
		st, err := gw.projection()
		return err == nil && st.Connected
	})
}

// TestWireRenewalUnderTraffic has the storage node renew its certificate
// every few seconds while a gateway serves steady traffic and deploys are
// applied: no request fails, every apply succeeds, and neither the gateway
// nor the test's own client reconnects.
func TestWireRenewalUnderTraffic(t *testing.T) {
	buildExtra(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--auth", "on", "--cert-ttl", "3s"}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	c.join("m1")
	gw := startEdgeGateway(t, c, "gw1", c.url, c.issueCreds(storagenode.RoleGateway, "gw1"))
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--gateway-wait", "10s")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})
	leaf := func() string {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(c.url, "nats://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return pki.Fingerprint(conn.ConnectionState().PeerCertificates[0])
	}

	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 4, stop)
	// Deploys go on while the node renews (every 2 s) three times.
	seen := map[string]bool{leaf(): true}
	deadline := time.Now().Add(40 * time.Second)
	applies := 0
	for v := 2; len(seen) < 4; v++ {
		if time.Now().After(deadline) {
			t.Fatalf("the node's certificate changed %d times in 40 s", len(seen)-1)
		}
		manifest := strings.Replace(helloV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d"`, v), 1)
		// The default drain grace: one of 20,183 requests failed with
		// 10 ms. It was not the renewal: the gateway had picked the old
		// instance before it switched routing, and under load the request
		// reached it (a reused connection) after the 10 ms, when its
		// graceful shutdown had closed idle connections; Go's transport
		// retried the GET on a new connection, refused, so 502. Covering
		// such a request is what the drain grace is for.
		c.mustControl("deploy", "apply", "-f", c.manifest(fmt.Sprintf("v%d.yaml", v), manifest), "--gateway-wait", "10s")
		applies++
		seen[leaf()] = true
	}
	close(stop)
	wg.Wait()
	t.Logf("%d certificates served; %d applies; %d requests, %d failed %v", len(seen), applies, l.ok.Load()+l.failed.Load(), l.failed.Load(), l.errs)
	if l.failed.Load() > 0 {
		t.Errorf("%d requests failed while the node renewed its certificate: %v", l.failed.Load(), l.errs)
	}
	if n := c.store.NC.Stats().Reconnects; n > 0 {
		t.Errorf("the test's client reconnected %d times", n)
	}
	st, err := gw.projection()
	if err != nil || !st.Connected || st.Rebuilds > 0 {
		t.Errorf("the gateway lost the store during renewals: %+v %v", st, err)
	}
	if out := gw.proc.output(); strings.Contains(out, "cannot reach the store") {
		t.Errorf("the gateway lost the store during renewals:\n%s", lines(out, "cannot reach")[0])
	}
}
