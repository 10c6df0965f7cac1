package storagenode

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// The fleet's TLS lives in the auth dir, beside the operator and account
// keys, and goes wherever they go (every storage node holds a copy):
//
//	tls/ca.crt      the CA storage nodes issue their certificates from
//	tls/ca.key      its private key
//	tls/bundle.crt  every CA clients and other nodes accept; ca.crt alone,
//	                or the old and the new CA while the CA is rotated
//	tls/generation  counts the changes of the two above (rotation steps)
//
// An auth dir made before TLS existed has no tls/ dir: its nodes stay
// plaintext, saying so, until `control tls init` adds one.
const (
	tlsDirName        = "tls"
	tlsCAFile         = "ca.crt"
	tlsCAKeyFile      = "ca.key"
	tlsBundleFile     = "bundle.crt"
	tlsGenerationFile = "generation"
)

// FleetTLS is the fleet CA of an auth dir.
type FleetTLS struct {
	// CA issues storage nodes' and boxes' certificates.
	CA *pki.CA
	// Bundle is every CA a certificate may chain to: CA, and during a
	// rotation the one before it.
	Bundle []*x509.Certificate
	// BundlePEM is Bundle as clients get it, in their credentials.
	BundlePEM []byte
	// Generation counts the changes of CA and Bundle (see
	// store.TLSBundleRecord).
	Generation int
}

// Pool is the bundle as a certificate pool.
func (f *FleetTLS) Pool() *x509.CertPool { return pki.Pool(f.Bundle) }

// LoadFleetTLS reads the fleet CA of authDir; nil (and no error) when the
// auth dir has none.
func LoadFleetTLS(authDir string) (*FleetTLS, error) {
	dir := filepath.Join(authDir, tlsDirName)
	certPEM, err := os.ReadFile(filepath.Join(dir, tlsCAFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, tlsCAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %s: %w", dir, err)
	}
	bundlePEM, err := os.ReadFile(filepath.Join(dir, tlsBundleFile))
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	bundle, err := pki.ParseCerts(bundlePEM)
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %s: %w", tlsBundleFile, err)
	}
	found := false
	for _, c := range bundle {
		found = found || pki.Fingerprint(c) == pki.Fingerprint(ca.Cert)
	}
	if !found {
		return nil, store.Errorf(store.CodeInvalid, "auth dir TLS: %s does not hold the CA in %s: nodes would not trust their own certificates", tlsBundleFile, tlsCAFile).
			With("auth_dir", authDir)
	}
	gen := 1
	if b, err := os.ReadFile(filepath.Join(dir, tlsGenerationFile)); err == nil {
		if gen, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil || gen < 1 {
			return nil, fmt.Errorf("auth dir TLS: %s: want a positive number, got %q", tlsGenerationFile, b)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	return &FleetTLS{CA: ca, Bundle: bundle, BundlePEM: bundlePEM, Generation: gen}, nil
}

// InitFleetTLS gives authDir a fleet CA: a new one, or ca when set (an
// operator's own, which must be able to issue). An auth dir that has one
// keeps it and is returned as it is.
func InitFleetTLS(authDir string, ca *pki.CA) (*FleetTLS, error) {
	if f, err := LoadFleetTLS(authDir); err != nil || f != nil {
		return f, err
	}
	if ca == nil {
		var err error
		if ca, err = pki.NewCA("edgeplane fleet CA", 0); err != nil {
			return nil, err
		}
	}
	keyPEM, err := pki.EncodeKey(ca.Key)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(authDir, tlsDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	// The key first and the bundle last: a dir with a bundle is complete.
	for _, f := range []struct {
		name string
		data []byte
	}{{tlsCAKeyFile, keyPEM}, {tlsCAFile, ca.CertPEM()}, {tlsBundleFile, ca.CertPEM()}} {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return nil, fmt.Errorf("auth dir TLS: %w", err)
		}
	}
	return LoadFleetTLS(authDir)
}

// clientTLS is the server side of the client port: TLS from the first byte
// (nothing, not even INFO, goes out before the handshake), certificates
// from certs. Clients authenticate with their credentials (a user JWT and
// the proof of its key), over the encrypted connection.
func clientTLS(certs *nodeCerts) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.server}
}

// routeTLS is both sides of a cluster route: each node presents its
// certificate and accepts only a peer whose certificate chains to the
// fleet's bundle, so a node of another CA is refused.
func routeTLS(certs *nodeCerts, bundle *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetCertificate:       certs.server,
		GetClientCertificate: certs.client,
		RootCAs:              bundle,
		ClientCAs:            bundle,
		ClientAuth:           tls.RequireAndVerifyClientCert,
	}
}

// TLSConfig is a storage node's TLS.
type TLSConfig struct {
	// Fleet is the auth dir's CA: the bundle clients and route peers are
	// verified against and, without CertFile, the CA the node issues its
	// own certificate from. Required.
	Fleet *FleetTLS
	// Names are names and addresses the node's certificate lists besides
	// those of its listeners (a load balancer's, a DNS name clients use).
	Names []string
	// CertFile and KeyFile, if set, are the node's certificate and key
	// from an operator's PKI (chaining to Fleet's bundle), read again
	// whenever they change; otherwise the node issues its own.
	CertFile, KeyFile string
	// CertTTL is the life of the certificates the node issues itself;
	// default pki.ServerTTL. They are renewed at two thirds of it.
	CertTTL time.Duration
	// RenewCheck is how often the certificate is looked at for renewal;
	// default DefaultRenewCheck, or a tenth of CertTTL when that is
	// shorter, so a short-lived certificate is renewed in its last third.
	RenewCheck time.Duration

	certs *nodeCerts
}

// DefaultRenewCheck is how often a node looks at its certificate.
const DefaultRenewCheck = time.Minute

// Leaf is the certificate the node presents now; nil before it started.
func (c *TLSConfig) Leaf() *x509.Certificate {
	if c.certs == nil {
		return nil
	}
	return c.certs.leaf()
}

// Renewals counts the certificates the node made after its first.
func (c *TLSConfig) Renewals() int64 {
	if c.certs == nil {
		return 0
	}
	return c.certs.renewals.Load()
}

func (c *TLSConfig) configure(opts *server.Options, logger *zap.Logger) error {
	if c.Fleet == nil {
		return errors.New("TLS: the auth dir holds no fleet CA (run `control tls init`)")
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	log := logger.Named("tls")
	var err error
	switch {
	case c.CertFile != "" || c.KeyFile != "":
		if c.CertFile == "" || c.KeyFile == "" {
			return errors.New("TLS: a node certificate needs both its certificate and its key file")
		}
		c.certs, err = fileCerts(c.CertFile, c.KeyFile, log)
	default:
		listeners := []string{net.JoinHostPort(opts.Host, "0")}
		if opts.Cluster.Port != 0 {
			listeners = append(listeners, net.JoinHostPort(opts.Cluster.Host, "0"))
		}
		dns, ips := certNames(listeners, c.Names)
		c.certs, err = issuedCerts(c.Fleet.CA, pki.ServerRequest{Name: opts.ServerName, DNSNames: dns, IPs: ips, TTL: c.CertTTL}, log)
	}
	if err != nil {
		return fmt.Errorf("TLS: %w", err)
	}
	if _, err := c.certs.leaf().Verify(x509.VerifyOptions{Roots: c.Fleet.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return store.Errorf(store.CodeInvalid, "TLS: the node certificate does not chain to the fleet bundle: %w", err)
	}
	opts.TLSConfig = clientTLS(c.certs)
	opts.TLSHandshakeFirst = true
	opts.TLSTimeout = tlsTimeout
	if opts.Cluster.Port != 0 {
		opts.Cluster.TLSConfig = routeTLS(c.certs, c.Fleet.Pool())
		opts.Cluster.TLSTimeout = tlsTimeout
	}
	// Clients connect to the servers they were given, never to ones a
	// server names (see store.Connect): the INFO lists none.
	opts.Cluster.NoAdvertise = true
	return nil
}

// tlsTimeout bounds a handshake, in seconds.
const tlsTimeout = 3

// renewWhile renews the node's certificate for as long as ns runs.
func (c *TLSConfig) renewWhile(ns *server.Server) {
	ctx, cancel := context.WithCancel(context.Background())
	every := c.RenewCheck
	if every <= 0 {
		ttl := cmp.Or(c.CertTTL, pki.ServerTTL)
		every = min(DefaultRenewCheck, max(ttl/10, 100*time.Millisecond))
	}
	go c.certs.run(ctx, every)
	go func() {
		ns.WaitForShutdown()
		cancel()
	}()
}

// certNamesOf lists the names and addresses cert is for.
func certNamesOf(cert *x509.Certificate) []string {
	out := append([]string(nil), cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// ServerConfig presents the node's certificate (renewed in place) for
// another service of the node on a port of its own, such as enrollment.
func (c *TLSConfig) ServerConfig() *tls.Config { return clientTLS(c.certs) }

// Rotating the fleet CA takes three steps, each applied to one copy of the
// auth dir and then copied to every storage node, which is restarted one at
// a time (clients move to the others meanwhile):
//
//  1. BeginCARotation makes the next CA and trusts it beside the current
//     one: nodes and, through the bundle in the store, clients trust both.
//  2. SwitchCA makes the next CA the one nodes issue from: each node's
//     certificate moves to it at its restart; everybody still trusts both.
//  3. FinishCARotation trusts the new CA alone, once every node moved.
//
// Each step bumps the generation, so the bundle in the store only ever
// moves forward.
const (
	tlsNextCAFile    = "next.crt"
	tlsNextCAKeyFile = "next.key"
)

// Rotation states of an auth dir's CA (CARotationState).
const (
	RotationNone     = "none"     // one CA, trusted alone
	RotationBegun    = "begun"    // the next CA is made and trusted; nodes still issue from the current one
	RotationSwitched = "switched" // nodes issue from the new CA; the old one is still trusted
)

// CARotationState says where authDir's CA rotation is.
func CARotationState(authDir string) (string, error) {
	f, err := LoadFleetTLS(authDir)
	if err != nil {
		return "", err
	}
	if f == nil {
		return "", store.Errorf(store.CodeNotFound, "auth dir %s holds no fleet CA (run `control tls init`)", authDir).With("auth_dir", authDir)
	}
	if _, err := os.Stat(filepath.Join(authDir, tlsDirName, tlsNextCAFile)); err == nil {
		return RotationBegun, nil
	}
	if len(f.Bundle) > 1 {
		return RotationSwitched, nil
	}
	return RotationNone, nil
}

// BeginCARotation makes the next CA of authDir and adds it to the bundle.
func BeginCARotation(authDir string) (*FleetTLS, error) {
	if err := wantRotation(authDir, RotationNone); err != nil {
		return nil, err
	}
	f, _ := LoadFleetTLS(authDir)
	next, err := pki.NewCA(fmt.Sprintf("edgeplane fleet CA %d", f.Generation+1), 0)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.EncodeKey(next.Key)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(authDir, tlsDirName)
	bundle := append(append([]byte(nil), f.CA.CertPEM()...), next.CertPEM()...)
	return writeTLSFiles(authDir, f.Generation+1, []tlsFile{{tlsNextCAKeyFile, keyPEM}, {tlsNextCAFile, next.CertPEM()}, {tlsBundleFile, bundle}}, nil, dir)
}

// SwitchCA makes the next CA the one authDir's nodes issue from.
func SwitchCA(authDir string) (*FleetTLS, error) {
	if err := wantRotation(authDir, RotationBegun); err != nil {
		return nil, err
	}
	f, _ := LoadFleetTLS(authDir)
	dir := filepath.Join(authDir, tlsDirName)
	certPEM, err := os.ReadFile(filepath.Join(dir, tlsNextCAFile))
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, tlsNextCAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	if _, err := pki.ParseCA(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("auth dir TLS: the next CA: %w", err)
	}
	return writeTLSFiles(authDir, f.Generation+1, []tlsFile{{tlsCAKeyFile, keyPEM}, {tlsCAFile, certPEM}},
		[]string{tlsNextCAFile, tlsNextCAKeyFile}, dir)
}

// FinishCARotation trusts authDir's current CA alone.
func FinishCARotation(authDir string) (*FleetTLS, error) {
	if err := wantRotation(authDir, RotationSwitched); err != nil {
		return nil, err
	}
	f, _ := LoadFleetTLS(authDir)
	return writeTLSFiles(authDir, f.Generation+1, []tlsFile{{tlsBundleFile, f.CA.CertPEM()}}, nil, filepath.Join(authDir, tlsDirName))
}

func wantRotation(authDir, want string) error {
	st, err := CARotationState(authDir)
	if err != nil {
		return err
	}
	if st != want {
		next := map[string]string{RotationNone: "begin", RotationBegun: "switch", RotationSwitched: "finish"}[st]
		return store.Errorf(store.CodeConflict, "the CA rotation of auth dir %s is %q; its next step is %s", authDir, st, next).
			With("auth_dir", authDir).With("state", st)
	}
	return nil
}

type tlsFile struct {
	name string
	data []byte
}

// writeTLSFiles writes files, removes remove, then records generation:
// a copy of the dir taken halfway is refused by no node (each file is
// whole) and its generation is the old one.
func writeTLSFiles(authDir string, generation int, files []tlsFile, remove []string, dir string) (*FleetTLS, error) {
	for _, f := range files {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return nil, fmt.Errorf("auth dir TLS: %w", err)
		}
	}
	for _, name := range remove {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("auth dir TLS: %w", err)
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, tlsGenerationFile), []byte(strconv.Itoa(generation)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("auth dir TLS: %w", err)
	}
	return LoadFleetTLS(authDir)
}
