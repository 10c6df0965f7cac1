package caddycerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// testCert is a self-signed certificate for names, valid from notBefore for
// a day.
func testCert(t *testing.T, serial int64, notBefore time.Time, names ...string) certmagic.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: notBefore, NotAfter: notBefore.Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	var c certmagic.Certificate
	c.Certificate = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	c.Leaf = leaf
	return c
}

func TestNewestValidCertificateIsServed(t *testing.T) {
	now := time.Now()
	old := testCert(t, 1, now.Add(-2*time.Hour), "shop.example.com")
	renewed := testCert(t, 2, now.Add(-time.Hour), "shop.example.com")
	future := testCert(t, 3, now.Add(time.Hour), "shop.example.com")
	other := testCert(t, 4, now, "other.example.com")
	hello := &tls.ClientHelloInfo{ServerName: "shop.example.com", SupportedVersions: []uint16{tls.VersionTLS13},
		SignatureSchemes: []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256}, SupportedCurves: []tls.CurveID{tls.CurveP256}}
	sel := newestCertificate{}
	for _, tc := range []struct {
		name    string
		choices []certmagic.Certificate
		want    int64
	}{
		{"the renewed one beside the old", []certmagic.Certificate{old, renewed}, 2},
		{"order does not matter", []certmagic.Certificate{renewed, old}, 2},
		{"not yet valid is passed over", []certmagic.Certificate{old, future, renewed}, 2},
		{"another name is never served", []certmagic.Certificate{other, old}, 1},
	} {
		got, err := sel.SelectCertificate(hello, tc.choices)
		if err != nil || got.Leaf.SerialNumber.Int64() != tc.want {
			t.Errorf("%s: got %v, %v; want serial %d", tc.name, got.Leaf, err, tc.want)
		}
	}
	if _, err := sel.SelectCertificate(hello, []certmagic.Certificate{other}); err == nil {
		t.Error("a certificate for another name was chosen")
	}
	// Nothing valid now: certmagic's own choice among the name's.
	if got, err := sel.SelectCertificate(hello, []certmagic.Certificate{future}); err != nil || got.Leaf.SerialNumber.Int64() != 3 {
		t.Errorf("only a not-yet-valid certificate: %v, %v", got.Leaf, err)
	}
}
