package storagenode

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store/pki"
)

// nodeCerts holds a storage node's certificate and renews it in place:
// the server hands out whatever current holds at each handshake, so a
// renewal needs no reload and drops no connection.
type nodeCerts struct {
	// renew makes the next certificate.
	renew func() (*tls.Certificate, error)
	// due says whether cur should be replaced now.
	due func(cur *tls.Certificate, now time.Time) bool
	log *zap.Logger

	current atomic.Pointer[tls.Certificate]
	// renewals counts certificates made after the first.
	renewals atomic.Int64
}

func (n *nodeCerts) server(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return n.current.Load(), nil
}

func (n *nodeCerts) client(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return n.current.Load(), nil
}

// leaf is the current certificate, parsed.
func (n *nodeCerts) leaf() *x509.Certificate { return n.current.Load().Leaf }

// issuedCerts are certificates a node issues itself from the fleet CA, for
// a key it made in memory (it never leaves the process), renewed once two
// thirds of their life have passed.
func issuedCerts(ca *pki.CA, req pki.ServerRequest, log *zap.Logger) (*nodeCerts, error) {
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	n := &nodeCerts{log: log}
	n.renew = func() (*tls.Certificate, error) {
		cert, err := ca.IssueServer(key.Public(), req)
		if err != nil {
			return nil, err
		}
		// The chain carries the CA: a joining box checks it against the
		// hash its invite names.
		return &tls.Certificate{Certificate: [][]byte{cert.Raw, ca.Cert.Raw}, PrivateKey: key, Leaf: cert}, nil
	}
	n.due = func(cur *tls.Certificate, now time.Time) bool {
		// Its life counts from issuance, not from the backdated NotBefore.
		issued := cur.Leaf.NotBefore.Add(pki.ClockSkew)
		return now.After(issued.Add(cur.Leaf.NotAfter.Sub(issued) * 2 / 3))
	}
	return n, n.first()
}

// fileCerts are certificates an operator's PKI issues: read from
// certFile and keyFile, and read again whenever either changes (the
// operator renews them).
func fileCerts(certFile, keyFile string, log *zap.Logger) (*nodeCerts, error) {
	var seen []byte
	n := &nodeCerts{log: log}
	read := func() ([]byte, *tls.Certificate, error) {
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return nil, nil, fmt.Errorf("node certificate: %w", err)
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("node key: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, fmt.Errorf("node certificate %s and key %s: %w", certFile, keyFile, err)
		}
		return append(certPEM, keyPEM...), &pair, nil
	}
	n.renew = func() (*tls.Certificate, error) {
		raw, pair, err := read()
		if err != nil {
			return nil, err
		}
		seen = raw
		return pair, nil
	}
	n.due = func(_ *tls.Certificate, _ time.Time) bool {
		raw, _, err := read()
		return err == nil && !bytes.Equal(raw, seen)
	}
	return n, n.first()
}

func (n *nodeCerts) first() error {
	c, err := n.renew()
	if err != nil {
		return err
	}
	n.current.Store(c)
	return nil
}

// run renews the certificate when it is due, checking every interval,
// until ctx ends. A failed renewal keeps the current certificate and is
// tried again at the next check.
func (n *nodeCerts) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if !n.due(n.current.Load(), now) {
				continue
			}
			c, err := n.renew()
			if err != nil {
				n.log.Error("renewing the node certificate (the current one is kept)", zap.Error(err))
				continue
			}
			n.current.Store(c)
			n.renewals.Add(1)
			n.log.Info("node certificate renewed", zap.Time("not_after", c.Leaf.NotAfter))
		}
	}
}

// certNames are the names and addresses a node is reached at: the hosts
// of its listeners (every address of this box for a wildcard one, and its
// hostname), loopback, and extra.
func certNames(listeners []string, extra []string) ([]string, []net.IP) {
	var dns []string
	var ips []net.IP
	seenDNS, seenIP := map[string]bool{}, map[string]bool{}
	add := func(h string) {
		if h == "" {
			return
		}
		if ip := net.ParseIP(h); ip != nil {
			if !seenIP[ip.String()] {
				seenIP[ip.String()] = true
				ips = append(ips, ip)
			}
			return
		}
		if !seenDNS[h] {
			seenDNS[h] = true
			dns = append(dns, h)
		}
	}
	for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
		add(h)
	}
	for _, l := range listeners {
		host, _, err := net.SplitHostPort(l)
		if err != nil {
			host = l
		}
		ip := net.ParseIP(host)
		if host != "" && (ip == nil || !ip.IsUnspecified()) {
			add(host)
			continue
		}
		// A wildcard listener is reached at any address of the box.
		if h, err := os.Hostname(); err == nil {
			add(h)
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				add(n.IP.String())
			}
		}
	}
	for _, h := range extra {
		add(h)
	}
	return dns, ips
}
