//go:build !race

package caddymodule

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// A connection the passthrough matcher does not take falls through to
// Caddy's own TLS: the host the gateway terminates gets Caddy's
// certificate and answer beside the passthrough services, and an unknown
// server name is refused.
//
// Not under the race detector: caddy-l4 v0.1.2's listener wrapper reads a
// fallen-through connection's byte counters for a debug log line
// (layer4/listener.go:187) while the HTTP server writes through it, a
// race in caddy-l4 that the detector reports whatever we do.
func TestL4PassthroughFallsThroughToCaddy(t *testing.T) {
	_, handshake := startPassthrough(t)

	// The terminated host: Caddy's certificate and its own answer.
	conn, err := handshake("web.test")
	if err != nil {
		t.Fatalf("web.test: %v", err)
	}
	if conn.ConnectionState().PeerCertificates[0].Subject.CommonName != "web.test" {
		t.Errorf("web.test: the certificate of %q", conn.ConnectionState().PeerCertificates[0].Subject.CommonName)
	}
	_, _ = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, _ := io.ReadAll(conn)
	if !bytes.Contains(resp, []byte("terminated")) {
		t.Errorf("web.test answered %q", resp)
	}
	conn.Close()

	// An unknown server name gets no certificate at all.
	if conn, err := handshake("nope.test"); err == nil {
		t.Errorf("unknown server name: handshake succeeded with %q", conn.ConnectionState().PeerCertificates[0].Subject.CommonName)
		conn.Close()
	}
}
