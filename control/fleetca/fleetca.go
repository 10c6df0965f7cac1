// Package fleetca is the operator's side of the fleet CA kept in a storage
// node's auth dir (store/storagenode holds the files and store/pki the
// certificates): giving an auth dir the CA, new or the operator's own,
// showing it, and the three steps of rotating it, each with what the
// operator does before the next.
package fleetca

import (
	"fmt"
	"io"
	"os"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Init gives the auth dir authDir (one storagenode.LoadAuth accepts) the
// fleet CA: the CA in caFile with its key in keyFile (PEM) when they are
// given, else a new one.
func Init(authDir, caFile, keyFile string) (*storagenode.FleetTLS, error) {
	var own *pki.CA
	if caFile != "" {
		certPEM, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, err
		}
		if own, err = pki.ParseCA(certPEM, keyPEM); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "--ca %s: %w", caFile, err)
		}
	}
	return storagenode.InitFleetTLS(authDir, own)
}

// Show writes the fleet CA of authDir: the issuing CA, the CAs trusted
// and where a rotation stands.
func Show(w io.Writer, authDir string) error {
	state, err := storagenode.CARotationState(authDir)
	if err != nil {
		return err
	}
	f, err := storagenode.LoadFleetTLS(authDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "issuing CA: %s (%s), valid until %s\n", pki.Fingerprint(f.CA.Cert), f.CA.Cert.Subject.CommonName, f.CA.Cert.NotAfter.Format("2006-01-02"))
	for _, ca := range f.Bundle {
		fmt.Fprintf(w, "trusted CA: %s (%s)\n", pki.Fingerprint(ca), ca.Subject.CommonName)
	}
	fmt.Fprintf(w, "generation %d, rotation %s\n", f.Generation, state)
	return nil
}

// Step is one step of a rotation of the fleet CA.
type Step struct {
	// Run moves an auth dir through the step.
	Run func(authDir string) (*storagenode.FleetTLS, error)
	// Next is what the operator does once it ran.
	Next string
}

// Steps are the steps of a rotation by name, in order: begin, switch,
// finish.
var Steps = map[string]Step{
	"begin": {storagenode.BeginCARotation, "copy the auth dir to every storage node and restart them one at a time; " +
		"long-running clients take the new bundle from the store within a minute, boxes offline meanwhile get it at their next start once connected; " +
		"then `control tls rotate switch`"},
	"switch": {storagenode.SwitchCA, "copy the auth dir to every storage node and restart them one at a time: each moves to a certificate of the new CA; " +
		"then `control tls rotate finish`"},
	"finish": {storagenode.FinishCARotation, "copy the auth dir to every storage node and restart them one at a time; " +
		"credentials issued before the rotation carry the old CA only: a box that never connected during it needs new ones"},
}
