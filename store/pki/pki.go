// Package pki is the fleet's own X.509: the certificate authority a storage
// node's auth dir holds, the server certificates storage nodes issue
// themselves for their client and route ports, the client certificates a
// box gets for a certificate request whose key never left it, the bundle of
// CAs every client verifies storage nodes against, and the hashes that name
// a CA in an invite and a certificate in a revocation. It knows nothing of
// NATS: package store and store/storagenode put it on the wire.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Lifetimes of what this package issues unless told otherwise.
const (
	// CATTL is a fleet CA's life: long, because rotating it is a
	// procedure (see the README), not routine.
	CATTL = 10 * 365 * 24 * time.Hour
	// ServerTTL is a storage node's certificate: short, renewed by the
	// node itself well before it ends.
	ServerTTL = 7 * 24 * time.Hour
	// ClientTTL is a box's certificate.
	ClientTTL = 365 * 24 * time.Hour
)

// ClockSkew backdates what is issued, so a peer whose clock is a little
// behind still accepts a certificate issued a moment ago.
const ClockSkew = 5 * time.Minute

// CA issues certificates under one CA certificate.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed CA named name, valid for ttl (CATTL when 0).
func NewCA(name string, ttl time.Duration) (*CA, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	if ttl <= 0 {
		ttl = CATTL
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"edgeplane"}},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating CA %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// ParseCA reads a CA from its certificate and private key in PEM. The
// certificate must be a CA whose key is the one given.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("CA certificate: want one certificate, found %d", len(certs))
	}
	if !certs[0].IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA", certs[0].Subject.CommonName)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !samePublicKey(certs[0].PublicKey, key.Public()) {
		return nil, fmt.Errorf("CA key does not belong to certificate %q", certs[0].Subject.CommonName)
	}
	return &CA{Cert: certs[0], Key: key}, nil
}

// CertPEM is the CA's certificate in PEM.
func (ca *CA) CertPEM() []byte { return EncodeCert(ca.Cert) }

// ServerRequest names what a storage node's certificate is for.
type ServerRequest struct {
	// Name is the node's name (the subject's common name).
	Name string
	// DNSNames and IPs are every name and address clients and other
	// nodes reach the node at.
	DNSNames []string
	IPs      []net.IP
	// TTL is the certificate's life; ServerTTL when 0.
	TTL time.Duration
}

// IssueServer issues a certificate for key pub: server authentication for
// the client port, and client authentication too, because a storage node
// dials other nodes' route ports with the same certificate.
func (ca *CA) IssueServer(pub crypto.PublicKey, r ServerRequest) (*x509.Certificate, error) {
	if len(r.DNSNames) == 0 && len(r.IPs) == 0 {
		return nil, errors.New("a server certificate needs at least one name or address")
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = ServerTTL
	}
	return ca.issue(pub, &x509.Certificate{
		Subject:     pkix.Name{CommonName: r.Name, Organization: []string{"edgeplane storage node"}},
		DNSNames:    r.DNSNames,
		IPAddresses: r.IPs,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, ttl)
}

// ClientRequest names whom a client certificate is for. The names come
// from the issuer's own records (an invite, `control creds issue`), never
// from what a certificate request says of itself.
type ClientRequest struct {
	// Name is the subject's common name: the machine, or the credentials'
	// name.
	Name string
	// Role is the NATS role the credentials carry it with, when one.
	Role string
	// Machine is the machine it belongs to, when one.
	Machine string
	// TTL is the certificate's life; ClientTTL when 0.
	TTL time.Duration
}

// URIs a client certificate names its machine and role with.
func machineURI(id string) *url.URL { return &url.URL{Scheme: "edgeplane", Opaque: "machine:" + id} }
func roleURI(role string) *url.URL  { return &url.URL{Scheme: "edgeplane", Opaque: "role:" + role} }

// IssueClient issues a client authentication certificate for key pub.
func (ca *CA) IssueClient(pub crypto.PublicKey, r ClientRequest) (*x509.Certificate, error) {
	if r.Name == "" {
		return nil, errors.New("a client certificate needs a name")
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = ClientTTL
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: r.Name, Organization: []string{"edgeplane"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if r.Machine != "" {
		tmpl.URIs = append(tmpl.URIs, machineURI(r.Machine))
	}
	if r.Role != "" {
		tmpl.URIs = append(tmpl.URIs, roleURI(r.Role))
	}
	return ca.issue(pub, tmpl, ttl)
}

// SignRequest issues a client certificate for a certificate request made
// where its key lives: the request's signature proves the key, and
// everything the certificate says comes from r.
func (ca *CA) SignRequest(csrPEM []byte, r ClientRequest) (*x509.Certificate, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("certificate request: want a PEM \"CERTIFICATE REQUEST\"")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	return ca.IssueClient(csr.PublicKey, r)
}

func (ca *CA) issue(pub crypto.PublicKey, tmpl *x509.Certificate, ttl time.Duration) (*x509.Certificate, error) {
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-ClockSkew)
	tmpl.NotAfter = now.Add(ttl)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if _, ok := pub.(*ecdsa.PublicKey); !ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issuing a certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// NewKey is a private key of the kind everything here uses: ECDSA P-256.
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// NewRequest is a certificate request for key, naming name (which the
// issuer replaces with its own records).
func NewRequest(key crypto.Signer, name string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, fmt.Errorf("creating a certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// EncodeCert is cert in PEM.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeKey is key in PEM (PKCS #8, "PRIVATE KEY").
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCerts reads every "CERTIFICATE" block of data, skipping other
// blocks (a credentials file holds its JWT and seed too).
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out, nil
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
}

// ParseKey reads the first private key block of data (PKCS #8, or the
// SEC 1 "EC PRIVATE KEY" an operator's PKI may hand out).
func ParseKey(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no private key found")
		}
		switch b.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing a private key: %w", err)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("a %T cannot sign", k)
			}
			return s, nil
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			return x509.ParsePKCS1PrivateKey(b.Bytes)
		}
	}
}

// Fingerprint is the hex SHA-256 of cert's DER: how an invite names the CA
// a joining box must be handed.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// SPKIHash is the hex SHA-256 of cert's public key (its
// SubjectPublicKeyInfo): what a revocation denies, so a certificate renewed
// for the same key stays refused.
func SPKIHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// Pool is a certificate pool of cas.
func Pool(cas []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range cas {
		p.AddCert(c)
	}
	return p
}

func samePublicKey(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if e, ok := a.(equaler); ok {
		return e.Equal(b)
	}
	da, err1 := x509.MarshalPKIXPublicKey(a)
	db, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(da, db)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}
