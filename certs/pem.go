package certs

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// parseLeaf returns the first certificate of a PEM bundle.
func parseLeaf(bundle []byte) (*x509.Certificate, error) {
	for len(bundle) > 0 {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			return x509.ParseCertificate(b.Bytes)
		}
	}
	return nil, fmt.Errorf("no certificate in PEM bundle")
}
