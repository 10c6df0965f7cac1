package cuts_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/internal/pebbletest"
	"github.com/edgeplane/edgeplane/store"
)

// gateway is a gateway's certificate side on a box's store, as the
// gateway wires it (certs/gateway_test.go, caddymodule): certmagic on the
// store's certificate storage, orders through the fleet's budget to
// Pebble, HTTP-01 answered on the port Pebble validates at, and TLS
// served from the certificate cache.
type gateway struct {
	cfg    *certmagic.Config
	acme   *certmagic.ACMEIssuer
	cache  *certmagic.Cache
	httpLn net.Listener
	tlsLn  net.Listener
}

func startGateway(t *testing.T, s *store.Store, pebble *pebbletest.Server, httpAddr string) (*gateway, error) {
	storage, err := certs.New(store.Bound(s), certs.Options{LockTTL: 2 * time.Second, Holder: "gateway"})
	if err != nil {
		return nil, err
	}
	rootPEM, err := os.ReadFile(pebble.RootCertPath)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(rootPEM)
	g := &gateway{}
	g.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return g.cfg, nil },
		Logger:           zap.NewNop(),
	})
	g.cfg = certmagic.New(g.cache, certmagic.Config{Storage: storage, Logger: zap.NewNop()})
	_, port, _ := net.SplitHostPort(httpAddr)
	var httpPort int
	fmt.Sscan(port, &httpPort)
	g.acme = certmagic.NewACMEIssuer(g.cfg, certmagic.ACMEIssuer{
		CA: pebble.DirectoryURL, TestCA: pebble.DirectoryURL, Email: "ops@example.com", Agreed: true,
		TrustedRoots: roots, ListenHost: "127.0.0.1", AltHTTPPort: httpPort, DisableTLSALPNChallenge: true,
		Logger: zap.NewNop(),
	})
	budget, err := certs.NewBudget(store.Bound(s), certs.BudgetOptions{Limit: 1000})
	if err != nil {
		g.cache.Stop()
		return nil, err
	}
	g.cfg.Issuers = []certmagic.Issuer{certs.BudgetIssuer{Issuer: g.acme, Budget: budget}}
	// The challenge port is the same across reboots (Pebble knows one);
	// the one just closed may linger a moment.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if g.httpLn, err = net.Listen("tcp", httpAddr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		g.cache.Stop()
		return nil, err
	}
	go http.Serve(g.httpLn, g.acme.HTTPChallengeHandler(http.NotFoundHandler()))
	tlsCfg := g.cfg.TLSConfig()
	tlsCfg.NextProtos = []string{"http/1.1"}
	if g.tlsLn, err = tls.Listen("tcp", "127.0.0.1:0", tlsCfg); err != nil {
		g.close()
		return nil, err
	}
	go http.Serve(g.tlsLn, http.NotFoundHandler())
	return g, nil
}

func (g *gateway) close() {
	g.httpLn.Close()
	if g.tlsLn != nil {
		g.tlsLn.Close()
	}
	g.cache.Stop()
}

// served is the certificate the gateway serves for host (a TLS
// handshake), by serial number.
func (g *gateway) served(host string) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", g.tlsLn.Addr().String(),
		&tls.Config{ServerName: host, InsecureSkipVerify: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// certLedger is the certificates the gateway served, by host, as serial
// numbers.
type certLedger struct {
	pebble   *pebbletest.Server
	httpAddr string
	n        atomic.Int64
	mu       sync.Mutex
	served   map[string]string
}

// work issues a certificate for host after host until the power goes, and
// records each the gateway then serves (the box's gateway: it dies with
// the box).
func (l *certLedger) work(t *testing.T) func(ctx context.Context, s *store.Store, _ *rand.Rand, ack func(func())) {
	return func(ctx context.Context, s *store.Store, _ *rand.Rand, ack func(func())) {
		g, err := startGateway(t, s, l.pebble, l.httpAddr)
		if err != nil {
			return
		}
		defer g.close()
		for ctx.Err() == nil {
			host := fmt.Sprintf("www.site%d.test", l.n.Add(1))
			if err := g.cfg.ManageSync(ctx, []string{host}); err != nil {
				continue
			}
			serial, err := g.served(host)
			if err != nil {
				continue
			}
			// Served, the certificate was in the store: certmagic keeps
			// what it obtained before it serves it, and the storage
			// writes through to the store.
			ack(func() { l.mu.Lock(); l.served[host] = serial; l.mu.Unlock() })
		}
	}
}

// check holds the store to the ledger: every certificate served is in the
// store with its key, and a gateway starting on the rebooted store serves
// each without ordering it again.
func (l *certLedger) check(ctx context.Context, t *testing.T, s *store.Store, cut string) {
	t.Helper()
	g, err := startGateway(t, s, l.pebble, l.httpAddr)
	if err != nil {
		t.Fatalf("%s: starting a gateway after the reboot: %v", cut, err)
	}
	defer g.close()
	l.mu.Lock()
	defer l.mu.Unlock()
	var hosts []string
	for host, serial := range l.served {
		issuer := g.acme.IssuerKey()
		certPEM, err := g.cfg.Storage.Load(ctx, certmagic.StorageKeys.SiteCert(issuer, host))
		if err != nil {
			t.Errorf("%s: LOST: the gateway served a certificate for %s; the store's: %v", cut, host, err)
			continue
		}
		if _, err := g.cfg.Storage.Load(ctx, certmagic.StorageKeys.SitePrivateKey(issuer, host)); err != nil {
			t.Errorf("%s: LOST: the gateway served a certificate for %s; its key in the store: %v", cut, host, err)
		}
		blk, _ := pem.Decode(certPEM)
		if blk == nil {
			t.Errorf("%s: the store's certificate for %s is not PEM", cut, host)
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || c.SerialNumber.String() != serial {
			t.Errorf("%s: LOST: the gateway served certificate %s for %s; the store holds another (%v)", cut, serial, host, err)
		}
		hosts = append(hosts, host)
	}
	before := l.pebble.Orders()
	if err := g.cfg.ManageSync(ctx, hosts); err != nil {
		t.Errorf("%s: a gateway on the rebooted store managing the certificates served before: %v", cut, err)
	}
	if n := l.pebble.Orders() - before; n > 0 {
		t.Errorf("%s: LOST: a gateway on the rebooted store ordered %d of the %d certificates served before again", cut, n, len(hosts))
	}
	for _, host := range hosts {
		if serial, err := g.served(host); err != nil || serial != l.served[host] {
			t.Errorf("%s: after the reboot the gateway serves %s for %s (%v), not %s", cut, serial, host, err, l.served[host])
		}
	}
}

// Power cuts at random points of certificate issuance against a real
// ACME server (Pebble): every certificate the gateway served is in the
// store afterwards, with its key, and is served again without a new
// order (ACME's rate limits are not spent twice).
func TestCutsCertificateIssuance(t *testing.T) {
	b := newBox(t)
	httpAddr := freeAddr(t)
	_, port, _ := net.SplitHostPort(httpAddr)
	var httpPort int
	fmt.Sscan(port, &httpPort)
	l := &certLedger{pebble: pebbletest.Start(t, httpPort), httpAddr: httpAddr, served: map[string]string{}}
	b.cutPower(t, scenario{cuts: 20, window: 1500 * time.Millisecond, work: l.work(t), check: l.check})
	t.Logf("%d certificates served and checked after each later cut; %d orders in all", len(l.served), l.pebble.Orders())
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
