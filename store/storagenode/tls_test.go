package storagenode_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// bootTLS boots a node with credentials (and so TLS) in a fresh auth dir.
func bootTLS(t *testing.T, cfg storagenode.BootConfig) *storagenode.Node {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Auth = storagenode.AuthOn
	n := boot(t, cfg)
	if n.TLS == nil {
		t.Fatal("a node with a new auth dir speaks no TLS")
	}
	return n
}

func hostPort(t *testing.T, n *storagenode.Node) string {
	t.Helper()
	u, err := url.Parse(n.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// The client port of a node with credentials says nothing to a plaintext
// client (not even INFO: TLS comes first) and closes on it; the node's own
// credentials carry the fleet CA and connect over TLS.
func TestClientPortSpeaksTLSOnly(t *testing.T) {
	var out bytes.Buffer
	n := bootTLS(t, storagenode.BootConfig{Progress: &out})
	if !strings.Contains(out.String(), "TLS required on the client port (from the first byte); certificate for localhost,") ||
		!strings.Contains(out.String(), "fleet CA "+pki.Fingerprint(n.Auth.TLS.CA.Cert)) {
		t.Fatalf("progress does not say TLS:\n%s", out.String())
	}
	c, err := net.Dial("tcp", hostPort(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("CONNECT {}\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	k, err := c.Read(buf)
	if k > 0 && bytes.Contains(buf[:k], []byte("INFO")) {
		t.Fatalf("the node answered a plaintext client: %q", buf[:k])
	}
	if err == nil {
		t.Fatalf("the node answered a plaintext client %q", buf[:k])
	}

	creds, err := os.ReadFile(n.CredsFile)
	if err != nil || !bytes.Contains(creds, []byte(store.BundleHeader)) {
		t.Fatalf("control credentials without the fleet CA (%v):\n%s", err, creds)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: n.CredsFile})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Fatal("the connection is not TLS")
	}
	if st, err := nc.TLSConnectionState(); err != nil || len(st.PeerCertificates) < 2 || !st.PeerCertificates[1].IsCA {
		t.Fatalf("the node's chain does not carry the CA (a joining box checks it): %v", err)
	}
}

// A client that was handed another fleet's CA, or a name the node's
// certificate does not list, refuses the node, names it and says why, and
// sends nothing (the credentials stay unused).
func TestClientRefusesANodeItCannotVerify(t *testing.T) {
	n := bootTLS(t, storagenode.BootConfig{})
	other, err := pki.NewCA("another fleet", 0)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(caFile, other.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: n.CredsFile, CAFile: caFile, Timeout: 3 * time.Second})
	se := store.AsError(err)
	if se == nil || se.Code != store.CodeTLS || !strings.Contains(se.Message, "not issued under the fleet CA in "+caFile) ||
		!strings.Contains(se.Message, n.Server.ClientURL()) || !strings.Contains(se.Message, "nothing was sent") {
		t.Fatalf("another CA: %v", err)
	}
	// The node's certificate names 127.0.0.1 and localhost: reached
	// through a forwarder at another address, it is refused.
	fwd := forward(t, "127.0.0.3:0", hostPort(t, n))
	_, err = store.Connect(store.ConnectOptions{URL: "nats://" + fwd, CredsFile: n.CredsFile, Timeout: 3 * time.Second})
	if se := store.AsError(err); se == nil || se.Code != store.CodeTLS || !strings.Contains(se.Message, "not for 127.0.0.3") {
		t.Fatalf("a name the certificate does not list: %v", err)
	}
	// A TLS URL without any CA is refused before dialing.
	_, err = store.Connect(store.ConnectOptions{URL: "tls://" + hostPort(t, n)})
	if !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "no fleet CA") {
		t.Fatalf("tls:// without a CA: %v", err)
	}
}

// The node renews its own certificate before it ends, under traffic: the
// connections it has keep going (no reconnect), new handshakes get the new
// certificate.
func TestNodeCertificateRenewsWithoutDroppingConnections(t *testing.T) {
	n := bootTLS(t, storagenode.BootConfig{CertTTL: 3 * time.Second, CertRenewCheck: 100 * time.Millisecond})
	first := n.TLS.Leaf()
	reconnects := 0
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: n.CredsFile, ReconnectForever: true,
		OnReconnect: func() { reconnects++ }})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("renewal.test")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	sent := 0
	for n.TLS.Renewals() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("renewed %d times in 15s", n.TLS.Renewals())
		}
		if err := nc.Publish("renewal.test", []byte("x")); err != nil {
			t.Fatal(err)
		}
		sent++
		if _, err := sub.NextMsg(time.Second); err != nil {
			t.Fatalf("message %d lost across a renewal: %v", sent, err)
		}
	}
	if reconnects != 0 || nc.Status() != nats.CONNECTED {
		t.Fatalf("the connection reconnected %d times across renewals", reconnects)
	}
	now := n.TLS.Leaf()
	if pki.Fingerprint(now) == pki.Fingerprint(first) {
		t.Fatal("the certificate did not change")
	}
	fresh, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: n.CredsFile})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	st, err := fresh.TLSConnectionState()
	if err != nil || pki.Fingerprint(st.PeerCertificates[0]) == pki.Fingerprint(first) {
		t.Fatalf("a new connection still gets the first certificate (%v)", err)
	}
}

// An auth dir from before TLS keeps its node plaintext, saying so; --tls
// on refuses it, naming what to do.
func TestAuthDirWithoutCA(t *testing.T) {
	authDir := t.TempDir()
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(authDir, "tls")); err != nil {
		t.Fatal(err)
	}
	_, err := storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Auth: storagenode.AuthOn,
		AuthDir: authDir, TLS: storagenode.ToggleOn})
	if !store.HasCode(err, store.CodeNotFound) || !strings.Contains(err.Error(), "control tls init") {
		t.Fatalf("--tls on without a CA: %v", err)
	}
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: t.TempDir(), Auth: storagenode.AuthOn, AuthDir: authDir, Progress: &out})
	if n.TLS != nil || !strings.Contains(out.String(), "WARNING: auth dir "+authDir+" holds no fleet CA, so this node speaks plaintext") {
		t.Fatalf("plaintext node: TLS %v, progress:\n%s", n.TLS, out.String())
	}
	creds, _ := os.ReadFile(n.CredsFile)
	if bytes.Contains(creds, []byte("CERTIFICATE")) {
		t.Fatal("a plaintext node's credentials carry a CA")
	}
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: n.CredsFile})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	// Then the CA comes, and the node speaks TLS from its next start.
	if _, err := storagenode.InitFleetTLS(authDir, nil); err != nil {
		t.Fatal(err)
	}
	n.Close()
	n2 := boot(t, storagenode.BootConfig{DataDir: t.TempDir(), Auth: storagenode.AuthOn, AuthDir: authDir})
	if n2.TLS == nil {
		t.Fatal("no TLS after control tls init")
	}
}

// The operator's own CA and node certificate: the node presents it and
// reads it again when the operator replaces the files.
func TestOperatorCertificate(t *testing.T) {
	authDir := t.TempDir()
	ca, err := pki.NewCA("operator PKI", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(filepath.Join(authDir, "tls"))
	if _, err := storagenode.InitFleetTLS(authDir, ca); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")
	issue := func(name string) {
		key, _ := pki.NewKey()
		cert, err := ca.IssueServer(key.Public(), pki.ServerRequest{Name: name, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, _ := pki.EncodeKey(key)
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(certFile, pki.EncodeCert(cert), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	issue("from the operator")
	n := boot(t, storagenode.BootConfig{DataDir: t.TempDir(), Auth: storagenode.AuthOn, AuthDir: authDir,
		TLSCertFile: certFile, TLSKeyFile: keyFile, CertRenewCheck: 50 * time.Millisecond})
	if got := n.TLS.Leaf().Subject.CommonName; got != "from the operator" {
		t.Fatalf("presents %q", got)
	}
	issue("renewed by the operator")
	storetest.Eventually(t, 5*time.Second, "the replaced files to be read again", func() bool {
		return n.TLS.Leaf().Subject.CommonName == "renewed by the operator"
	})
	conn, err := tls.Dial("tcp", hostPort(t, n), &tls.Config{RootCAs: pki.Pool([]*x509.Certificate{ca.Cert})})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// forward accepts on listen and copies every connection's bytes both ways
// to target, until the test ends; it returns its address.
func forward(t *testing.T, listen, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return l.Addr().String()
}

// Turning TLS on where a node ran plaintext with credentials: `control tls
// init` on its auth dir, then a restart on the same data dir. The store is
// as it was; a client with credentials from before (which carry no CA) is
// told what is missing, and connects once given the CA file (or new
// credentials, which carry it) — nothing needs re-issuing at once.
func TestTurningTLSOnKeepsTheStoreAndTheCredentials(t *testing.T) {
	authDir, dataDir := t.TempDir(), t.TempDir()
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(authDir, "tls")); err != nil {
		t.Fatal(err)
	}
	cfg := storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir}
	n := boot(t, cfg)
	if n.TLS != nil {
		t.Fatal("a node whose auth dir has no CA speaks TLS")
	}
	ctx := context.Background()
	nMachines := storetest.Bucket(t, n.Store, n.Store.Names.MachinesBucket())
	if _, err := nMachines.Put(ctx, "m1", []byte(`{"id":"m1"}`)); err != nil {
		t.Fatal(err)
	}
	oldCreds := filepath.Join(t.TempDir(), "agent.creds")
	b, err := n.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "before"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oldCreds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	n.Close()

	fleet, err := storagenode.InitFleetTLS(authDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	n = boot(t, cfg)
	if n.TLS == nil {
		t.Fatal("no TLS after the auth dir got its CA")
	}
	url := n.Server.ClientURL()
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("client URL %s", url)
	}
	_, err = store.Connect(store.ConnectOptions{URL: url, CredsFile: oldCreds})
	if !errors.Is(err, store.ErrNoFleetCA) || !strings.Contains(err.Error(), "CA file") {
		t.Fatalf("credentials from before TLS, no CA file: %v", err)
	}
	caFile := filepath.Join(authDir, "tls", "bundle.crt")
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: oldCreds, CAFile: caFile})
	if err != nil {
		t.Fatalf("credentials from before TLS with the CA file: %v", err)
	}
	defer nc.Close()
	if _, err := nc.TLSConnectionState(); err != nil {
		t.Fatalf("not TLS: %v", err)
	}
	s, err := store.Open(ctx, nc, n.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	sMachines := storetest.Bucket(t, s, s.Names.MachinesBucket())
	if e, err := sMachines.Get(ctx, "m1"); err != nil || string(e.Value()) != `{"id":"m1"}` {
		t.Fatalf("the store after turning TLS on: %v", err)
	}
	// New credentials carry the CA: nothing else is needed.
	b, err = n.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, fleet.CA.CertPEM()) {
		t.Fatal("credentials issued after tls init do not carry the CA")
	}
}
