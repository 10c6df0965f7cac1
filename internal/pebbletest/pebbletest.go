// Package pebbletest runs Pebble, Let's Encrypt's ACME test server, on
// loopback for the end-to-end tests (certs, certs/caddycerts, integration),
// so that all of them order certificates from a real ACME server set up the
// same way.
package pebbletest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/store/storetest"
)

// Server is a running Pebble whose log the test reads to count orders.
type Server struct {
	// DirectoryURL is Pebble's ACME directory.
	DirectoryURL string
	// RootCertPath is the PEM file of the self-signed certificate Pebble's
	// HTTPS listener serves: an ACME client must trust it to reach
	// DirectoryURL.
	RootCertPath string

	orders atomic.Int32
}

// Orders is how many orders Pebble has added since it started; tests
// compare it before and after to count the orders a step cost.
func (s *Server) Orders() int { return int(s.orders.Load()) }

// Start runs Pebble on loopback and returns once it serves its directory.
// Pebble validates every HTTP-01 challenge at 127.0.0.1:httpPort, whatever
// the name. The test is skipped when no Pebble can be found or built. Pebble
// stops when the test ends, and a failed test logs the tail of its log.
func Start(t testing.TB, httpPort int) *Server {
	t.Helper()
	return StartFor(t, httpPort, freePort(t))
}

// StartFor is Start for a gateway that also answers TLS-ALPN-01 challenges:
// Pebble validates those at 127.0.0.1:tlsPort.
func StartFor(t testing.TB, httpPort, tlsPort int) *Server {
	t.Helper()
	dnsAddr := startDNS(t)
	bin := binary(t)
	dir := t.TempDir()
	certPath, keyPath := writeServerCert(t, dir)
	port := freePort(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  fmt.Sprintf("127.0.0.1:%d", port),
		"managementListenAddress":        fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"certificate":                    certPath,
		"privateKey":                     keyPath,
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
		"profiles":                       map[string]any{"default": map[string]any{"description": "test", "validityPeriod": 7776000}},
	}}
	data, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-config", cfgPath, "-dnsserver", dnsAddr)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting pebble: %v", err)
	}
	s := &Server{DirectoryURL: fmt.Sprintf("https://127.0.0.1:%d/dir", port), RootCertPath: certPath}
	logPath := filepath.Join(dir, "pebble.log")
	logf, _ := os.Create(logPath)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := sc.Text()
			fmt.Fprintln(logf, l)
			if strings.Contains(l, "Added order") {
				s.orders.Add(1)
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		// Wait closes the pipe, so the log must be read to its end first.
		<-scanned
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("pebble log (tail):\n%s", b[max(0, len(b)-3000):])
		}
	})
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(certPath)
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: time.Second}
	storetest.Eventually(t, 20*time.Second, "pebble to serve its directory", func() bool {
		resp, err := client.Get(s.DirectoryURL)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return s
}

// binary finds Pebble: $PEBBLE_BIN, or what install.sh put beside this
// file, installing it there first if it is missing. Pebble is not
// optional: a test that needs it fails, saying why, when it cannot be had.
func binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PEBBLE_BIN"); p != "" {
		if !fileExists(p) {
			t.Fatalf("PEBBLE_BIN=%s: no such file", p)
		}
		return p
	}
	p := installed()
	if fileExists(p) {
		return p
	}
	// The same `go install` install.sh runs, outside this module, so that
	// Pebble's own dependencies need not be in our go.mod. Concurrent test
	// processes may race here: the install renames the binary into place.
	cmd := exec.Command("go", "install", "github.com/letsencrypt/pebble/v2/cmd/pebble@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(p))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pebble %s is needed and could not be installed (run internal/pebbletest/install.sh or set PEBBLE_BIN): go install: %v\n%s", Version, err, b)
	}
	return p
}

// Version is the Pebble release the tests run (install.sh installs the same).
const Version = "v2.10.1"

// installed is where install.sh, beside this file, puts Pebble. It is
// found from this file's path, not the working directory, because the tests
// that use this package each run in their own package's directory.
func installed() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	return filepath.Join(filepath.Dir(file), "bin", "pebble")
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// writeServerCert writes a self-signed certificate for 127.0.0.1 (Pebble's
// HTTPS listener; ACME clients trust it as Server.RootCertPath) and returns
// the cert and key paths.
func writeServerCert(t testing.TB, dir string) (string, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pebble test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certPath, keyPath := filepath.Join(dir, "pebble.crt"), filepath.Join(dir, "pebble.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// listenUDPAndTCP listens on one loopback port over both UDP and TCP:
// Pebble's resolver may ask over either. The port the kernel picks for UDP
// can be in use for TCP (by a listener, or as the local port of a
// connection), so another port is tried until both are free.
func listenUDPAndTCP(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var last error
	for range 50 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tl, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, tl
		}
		pc.Close()
		last = err
	}
	t.Fatalf("no loopback port free for both UDP and TCP: %v", last)
	return nil, nil
}

// startDNS answers 127.0.0.1 for every A question, so Pebble's VA sends
// every HTTP-01 validation to the test's port on loopback.
func startDNS(t testing.TB) string {
	t.Helper()
	pc, tl := listenUDPAndTCP(t)
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP("127.0.0.1")})
			}
		}
		_ = w.WriteMsg(m)
	})
	udp := &dns.Server{PacketConn: pc, Handler: handler}
	tcp := &dns.Server{Listener: tl, Handler: handler}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
	return pc.LocalAddr().String()
}
