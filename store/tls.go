package store

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store/pki"
)

// TLS toward storage nodes. With credentials, a storage node's client port
// speaks TLS from the first byte; a client verifies the node against the
// fleet's CA bundle, which comes with its credentials (the CERTIFICATE
// blocks after the JWT and seed of a credentials file from `control creds
// issue` or an invite), or from Config.CAFile. A client connects to the
// servers it was given and to no other, whatever a server's INFO names,
// and sends nothing before the node proved itself: a failed verification
// is a CodeTLS error naming the server and why, and the connection ends
// there.

// CodeTLS refuses a connection whose storage node did not prove itself
// under the fleet CA (or that speaks no TLS where TLS is required).
const CodeTLS = "tls"

// BundleHeader precedes the fleet's CA bundle in a credentials file.
const BundleHeader = "************************* FLEET CA *************************\n" +
	"Storage nodes must present a certificate issued under one of these; the\n" +
	"CA's SHA-256 fingerprint is what `control machine invite` tokens carry.\n"

// AppendBundle adds the CA bundle to a credentials file's contents.
func AppendBundle(creds, bundlePEM []byte) []byte {
	out := append([]byte(nil), creds...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, '\n')
	out = append(out, BundleHeader...)
	out = append(out, '\n')
	return append(out, bundlePEM...)
}

// trust is the CA bundle one process verifies storage nodes against. Each
// connection reads it afresh when it dials, so a bundle updated while the
// process runs (a CA rotation) holds from the next reconnect on.
type trust struct {
	source string

	mu   sync.Mutex
	pool *x509.CertPool
	// pem is the bundle pool was made from.
	pem string
}

func (t *trust) rootCAs() (*x509.CertPool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pool, nil
}

func (t *trust) bundle() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pem
}

func (t *trust) set(pool *x509.CertPool, pem string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pool, t.pem = pool, pem
}

// trusts holds one trust per source (a credentials or CA file), shared by
// every connection of the process that uses it.
var trusts = struct {
	sync.Mutex
	m map[string]*trust
}{m: map[string]*trust{}}

// loadTrust reads the CA bundle of file (a credentials file or a PEM
// bundle), or the one followed beside it (BundleFile) when that is newer;
// nil when the file holds no certificate.
func loadTrust(file string) (*trust, error) {
	pem, err := bundleOf(file)
	if err != nil {
		return nil, err
	}
	if pem == nil {
		return nil, nil
	}
	certs, err := pki.ParseCerts(pem)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	trusts.Lock()
	defer trusts.Unlock()
	t := trusts.m[file]
	if t == nil {
		t = &trust{source: file}
		trusts.m[file] = t
	}
	t.set(pki.Pool(certs), string(pem))
	return t, nil
}

// bundleOf is the CA certificates of file, in PEM, or of its BundleFile
// when that was written after file (credentials issued later carry a
// bundle at least as new); nil when there are none.
func bundleOf(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if bfi, err := os.Stat(BundleFile(file)); err == nil && bfi.ModTime().After(fi.ModTime()) {
		if followed, err := os.ReadFile(BundleFile(file)); err == nil {
			if certs, err := pki.ParseCerts(followed); err == nil && len(certs) > 0 {
				return followed, nil
			}
		}
	}
	certs, err := pki.ParseCerts(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(certs) == 0 {
		return nil, nil
	}
	var out []byte
	for _, c := range certs {
		out = append(out, pki.EncodeCert(c)...)
	}
	return out, nil
}

// tlsOptions are the connect options that make a connection TLS from the
// first byte, verified under t, to the servers of urls only.
func tlsOptions(t *trust) []nats.Option {
	return []nats.Option{
		nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}),
		nats.ClientTLSConfig(nil, t.rootCAs),
		nats.TLSHandshakeFirst(),
		nats.IgnoreDiscoveredServers(),
	}
}

// TLSFailure is why nc, reconnecting, was refused by its own side of a TLS
// handshake (the server did not prove itself under the fleet CA, or spoke
// no TLS): a CodeTLS error naming the server and what did not match; nil
// when nc's last error is something else or none.
func TLSFailure(nc *nats.Conn) error {
	err := nc.LastError()
	if err == nil {
		return nil
	}
	return tlsError(strings.Join(nc.Servers(), ","), err, true, "")
}

// tlsError turns a connect failure of a TLS handshake into a CodeTLS
// error that names the server and what did not match.
func tlsError(url string, err error, withTLS bool, source string) error {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var rec tls.RecordHeaderError
	reason := ""
	switch {
	case errors.As(err, &unknown):
		reason = "its certificate is not issued under the fleet CA"
		if source != "" {
			reason += " in " + source
		}
		if unknown.Cert != nil {
			reason += fmt.Sprintf(" (it presented %q, issued by %q)", unknown.Cert.Subject.CommonName, unknown.Cert.Issuer.CommonName)
		}
	case errors.As(err, &host):
		reason = fmt.Sprintf("its certificate is not for %s (%s)", host.Host, host.Error())
	case errors.As(err, &invalid):
		reason = "its certificate is not valid: " + invalid.Error()
	case errors.As(err, &rec):
		reason = "it does not speak TLS"
	case withTLS && errors.Is(err, nats.ErrTLS):
		reason = strings.TrimPrefix(err.Error(), nats.ErrTLS.Error()+": ")
	default:
		return nil
	}
	return Errorf(CodeTLS, "TLS with the storage node at %s failed: %s; nothing was sent to it", redactURL(url), reason).
		With("url", redactURL(url)).With("ca", source)
}

// redactURL drops any user:password from a NATS URL list.
func redactURL(list string) string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			u.User = nil
			s = u.String()
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// parseServerURL parses one server of a URL list as nats.go does, which
// takes "host:port" for "nats://host:port".
func parseServerURL(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	return url.Parse(s)
}

// hasURLSecret reports whether a server of list carries a user, password
// or token in its URL.
func hasURLSecret(list string) bool {
	for _, s := range strings.Split(list, ",") {
		if u, err := parseServerURL(s); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// allSecureURLs reports whether every server of list is dialled over TLS
// whatever the options say (tls://, wss://).
func allSecureURLs(list string) bool {
	for _, s := range strings.Split(list, ",") {
		u, err := parseServerURL(s)
		if err != nil || (u.Scheme != "tls" && u.Scheme != "wss") {
			return false
		}
	}
	return true
}

// LoopbackURLs reports whether every server of list, NATS URLs separated
// by commas, is on this box.
func LoopbackURLs(list string) bool {
	for _, s := range strings.Split(list, ",") {
		u, err := parseServerURL(s)
		if err != nil {
			return false
		}
		h := u.Hostname()
		if ip := net.ParseIP(h); h != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

// FleetCAs are the CAs c verifies storage nodes against: its CA file's, or
// those its credentials carry; none for a plaintext setup.
func (c Config) FleetCAs() ([]*x509.Certificate, error) {
	src := cmp.Or(c.CAFile, c.CredsFile)
	if src == "" {
		return nil, nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", src, err)
	}
	return pki.ParseCerts(b)
}
