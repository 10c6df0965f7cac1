package caddycerts

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/caddyserver/certmagic"
)

// newestCertificate serves, of the certificates in memory for a name, the
// newest one that is valid now and that the client supports. certmagic's
// default serves the first it cached; after a renewal done by the fleet's
// renewal work, or by another gateway while this one was cut off, the
// renewed certificate sits beside the old one until certmagic's own
// maintenance would drop it, and it is the one to serve.
type newestCertificate struct{}

func (newestCertificate) SelectCertificate(hello *tls.ClientHelloInfo, choices []certmagic.Certificate) (certmagic.Certificate, error) {
	// certmagic hands every cached certificate to a custom selector when
	// none matches the name: only those for the name may be chosen.
	var matching []certmagic.Certificate
	for _, c := range choices {
		if c.Leaf == nil || hello.ServerName != "" && c.Leaf.VerifyHostname(hello.ServerName) != nil {
			continue
		}
		matching = append(matching, c)
	}
	if len(matching) == 0 {
		return certmagic.Certificate{}, fmt.Errorf("no certificate in memory for %q", hello.ServerName)
	}
	now := time.Now()
	best := -1
	for i, c := range matching {
		if now.Before(c.Leaf.NotBefore) || now.After(c.Leaf.NotAfter) || hello.SupportsCertificate(&c.Certificate) != nil {
			continue
		}
		if best < 0 || c.Leaf.NotBefore.After(matching[best].Leaf.NotBefore) {
			best = i
		}
	}
	if best >= 0 {
		return matching[best], nil
	}
	// None valid and supported: certmagic's own choice, which still
	// answers (and its maintenance renews).
	return certmagic.DefaultCertificateSelector(hello, matching)
}

var _ certmagic.CertificateSelector = newestCertificate{}
