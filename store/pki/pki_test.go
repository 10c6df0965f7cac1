package pki

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"
)

func mustCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// A CA survives its own PEM round trip, and a key that is not its own, or a
// certificate that is no CA, is refused.
func TestCAFromPEM(t *testing.T) {
	ca := mustCA(t, "fleet")
	keyPEM, err := EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(ca.CertPEM(), keyPEM)
	if err != nil || Fingerprint(back.Cert) != Fingerprint(ca.Cert) {
		t.Fatalf("round trip: %v", err)
	}
	other := mustCA(t, "other")
	otherKey, _ := EncodeKey(other.Key)
	if _, err := ParseCA(ca.CertPEM(), otherKey); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Fatalf("a foreign key: %v", err)
	}
	leafKey, _ := NewKey()
	leaf, err := ca.IssueClient(leafKey.Public(), ClientRequest{Name: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	lk, _ := EncodeKey(leafKey)
	if _, err := ParseCA(EncodeCert(leaf), lk); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Fatalf("a leaf as CA: %v", err)
	}
}

// A storage node's certificate verifies for its names and addresses, as a
// server and as a route client, under the fleet CA only.
func TestServerCertificate(t *testing.T) {
	ca := mustCA(t, "fleet")
	key, _ := NewKey()
	cert, err := ca.IssueServer(key.Public(), ServerRequest{Name: "s1", DNSNames: []string{"s1.example.net", "localhost"},
		IPs: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := cert.NotAfter.Sub(cert.NotBefore); got > ServerTTL+ClockSkew+time.Second {
		t.Fatalf("lifetime %s, want about %s", got, ServerTTL)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, name := range []string{"s1.example.net", "10.0.0.1", "127.0.0.1"} {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: Pool([]*x509.Certificate{ca.Cert}), DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s for %v: %v", name, usage, err)
			}
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: Pool([]*x509.Certificate{ca.Cert}), DNSName: "10.0.0.2"}); err == nil {
		t.Error("verified for an address it does not name")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: Pool([]*x509.Certificate{mustCA(t, "other").Cert}), DNSName: "10.0.0.1"}); err == nil {
		t.Error("verified under another CA")
	}
	if _, err := ca.IssueServer(key.Public(), ServerRequest{Name: "s1"}); err == nil {
		t.Error("a server certificate without a name was issued")
	}
}

// A box's request proves its key; the certificate says what the issuer's
// records say, whatever the request claimed, and a tampered request is
// refused.
func TestSignRequest(t *testing.T) {
	ca := mustCA(t, "fleet")
	key, _ := NewKey()
	csr, err := NewRequest(key, "admin-of-everything")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.SignRequest(csr, ClientRequest{Name: "m1", Machine: "m1", Role: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "m1" || len(cert.URIs) != 2 || cert.URIs[0].String() != "edgeplane:machine:m1" || cert.URIs[1].String() != "edgeplane:role:agent" {
		t.Fatalf("subject %q, URIs %v", cert.Subject.CommonName, cert.URIs)
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		t.Fatal("the certificate is not for the request's key")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: Pool([]*x509.Certificate{ca.Cert}), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: Pool([]*x509.Certificate{ca.Cert}), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("a client certificate verified as a server's")
	}
	// Tamper with the signed bytes.
	b, _ := pem.Decode(csr)
	b.Bytes[len(b.Bytes)-3] ^= 0xff
	if _, err := ca.SignRequest(pem.EncodeToMemory(b), ClientRequest{Name: "m1"}); err == nil {
		t.Fatal("a tampered request was signed")
	}
	if _, err := ca.SignRequest([]byte("not pem"), ClientRequest{Name: "m1"}); err == nil {
		t.Fatal("garbage was signed")
	}
}

// A renewal for the same key keeps the key's hash (what revocations deny)
// and changes the certificate's.
func TestHashes(t *testing.T) {
	ca := mustCA(t, "fleet")
	key, _ := NewKey()
	a, _ := ca.IssueClient(key.Public(), ClientRequest{Name: "m1"})
	b, _ := ca.IssueClient(key.Public(), ClientRequest{Name: "m1"})
	if SPKIHash(a) != SPKIHash(b) || Fingerprint(a) == Fingerprint(b) {
		t.Fatalf("spki %s %s, fingerprint %s %s", SPKIHash(a), SPKIHash(b), Fingerprint(a), Fingerprint(b))
	}
	if len(SPKIHash(a)) != 64 {
		t.Fatalf("hash %q", SPKIHash(a))
	}
}

// Keys and certificates come out of files that hold other blocks too.
func TestParseFromMixedFile(t *testing.T) {
	ca := mustCA(t, "fleet")
	key, _ := NewKey()
	cert, _ := ca.IssueClient(key.Public(), ClientRequest{Name: "m1"})
	keyPEM, _ := EncodeKey(key)
	file := "-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n\n" + string(EncodeCert(cert)) + string(keyPEM) + string(ca.CertPEM())
	certs, err := ParseCerts([]byte(file))
	if err != nil || len(certs) != 2 || !certs[1].IsCA {
		t.Fatalf("certs %d %v", len(certs), err)
	}
	k, err := ParseKey([]byte(file))
	if err != nil || !samePublicKey(k.Public(), key.Public()) {
		t.Fatalf("key: %v", err)
	}
	if _, err := ParseKey(ca.CertPEM()); err == nil {
		t.Fatal("found a key where there is none")
	}
}
