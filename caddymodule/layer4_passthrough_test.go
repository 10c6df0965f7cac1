package caddymodule

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// selfSigned is a certificate for host, as PEM and as a tls.Certificate.
func selfSigned(t testing.TB, host string) (certPEM, keyPEM []byte, cert tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host},
		DNSNames: []string{host}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM, cert
}

// tlsBackend is an instance that terminates TLS with its own certificate
// and answers its name.
func tlsBackend(t testing.TB, name, host string) *echoServer {
	t.Helper()
	_, _, cert := selfSigned(t, host)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, name, func(c net.Conn) {
		_, _ = io.WriteString(c, name+"\n")
		_, _ = io.Copy(io.Discard, c)
	})
}

// passthroughConfig is a gateway whose HTTPS server passes TLS for the
// passthrough hosts through (caddy-l4's listener wrapper, the tls matcher
// with edgeplane_passthrough, the edgeplane layer-4 handler) and
// terminates web.test itself.
func (f *fixture) passthroughConfig(webCert, webKey []byte) []byte {
	f.t.Helper()
	cfg := map[string]any{
		"admin":   map[string]any{"listen": f.admin},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": f.natsURL, "snapshot_path": f.snap, "gateway_name": "gw-test", "disable_health_checks": true},
			"tls": map[string]any{"certificates": map[string]any{"load_pem": []any{map[string]any{
				"certificate": string(webCert), "key": string(webKey)}}}},
			"http": map[string]any{"servers": map[string]any{"https": map[string]any{
				"listen": []string{f.gateway},
				"listener_wrappers": []any{
					map[string]any{"wrapper": "layer4", "routes": []any{map[string]any{
						"match":  []any{map[string]any{"tls": map[string]any{"edgeplane_passthrough": map[string]any{}}}},
						"handle": []any{map[string]any{"handler": "edgeplane"}},
					}}},
					map[string]any{"wrapper": "tls"},
				},
				"tls_connection_policies": []any{map[string]any{}},
				"routes":                  []any{map[string]any{"handle": []any{map[string]any{"handler": "static_response", "body": "terminated"}}}},
				"automatic_https":         map[string]any{"disable": true},
			}}},
		},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// startPassthrough runs a gateway whose HTTPS listener passes db.test and
// mq.test through to services with certificates of their own and
// terminates web.test itself; handshake connects to it with a server name.
func startPassthrough(t *testing.T) (f *fixture, handshake func(sni string) (*tls.Conn, error)) {
	f = newFixture(t)
	webCert, webKey, _ := selfSigned(t, "web.test")
	db, mq := tlsBackend(t, "db-1", "db.test"), tlsBackend(t, "mq-1", "mq.test")
	passthrough := func(host string, e *echoServer) storetest.Service {
		return storetest.Service{Instances: []storetest.Instance{e.instance("m1")},
			Layer4: store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{host}}}}
	}
	loadCaddy(t, f.passthroughConfig(webCert, webKey))
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": passthrough("db.test", db), "mq": passthrough("mq.test", mq)}))
	return f, func(sni string) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", f.gateway,
			&tls.Config{ServerName: sni, InsecureSkipVerify: true})
	}
}

// Two services with certificates of their own behind the gateway's HTTPS
// listener: each client sees its own service's certificate and answer.
// (The host the gateway terminates beside them, and an unknown server
// name: layer4_fallthrough_test.go.)
func TestL4TLSPassthroughBySNI(t *testing.T) {
	f, handshake := startPassthrough(t)
	for _, c := range []struct{ sni, name string }{{"db.test", "db-1"}, {"mq.test", "mq-1"}, {"DB.test", "db-1"}} {
		conn, err := handshake(c.sni)
		if err != nil {
			t.Fatalf("%s: %v", c.sni, err)
		}
		if got := conn.ConnectionState().PeerCertificates[0].Subject.CommonName; got != lowerHost(c.sni) {
			t.Errorf("%s: the certificate of %q, want its service's own", c.sni, got)
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 16)
		n, _ := io.ReadAtLeast(conn, buf, len(c.name)+1)
		if string(buf[:n]) != c.name+"\n" {
			t.Errorf("%s: answered %q, want %q", c.sni, buf[:n], c.name)
		}
		conn.Close()
	}

	// Counted as the service's layer-4 connections.
	if l4 := current.Load().shared.traffic.of(mustService(t, f, "shop", "db")).l4.snapshot(); l4 == nil || l4.Total != 2 {
		t.Errorf("db's layer-4 counters: %+v", l4)
	}
}

func lowerHost(h string) string { return strings.ToLower(h) }
