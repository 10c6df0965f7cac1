package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// authDirFlags are --data and --auth-dir of the commands that work on a
// storage node's auth dir.
func authDirFlags(fs *flag.FlagSet) func() (string, error) {
	data := fs.String("data", "", "the storage node's data dir (its auth dir is DATA/auth)")
	authDir := fs.String("auth-dir", "", "auth dir (overrides --data)")
	return func() (string, error) {
		switch {
		case *authDir != "":
			return *authDir, nil
		case *data != "":
			return filepath.Join(*data, "auth"), nil
		}
		return "", usagef("--data DIR or --auth-dir DIR is required (run this on a storage node)")
	}
}

func setupTLSInit(fs *flag.FlagSet) func(*call) error {
	dir := authDirFlags(fs)
	caFile := fs.String("ca", "", "your own CA certificate `FILE` (PEM) to issue from, instead of a new CA")
	caKey := fs.String("ca-key", "", "the key `FILE` of --ca")
	return func(c *call) error {
		authDir, err := dir()
		if err != nil {
			return err
		}
		if _, err := storagenode.LoadAuth(authDir, false); err != nil {
			return err
		}
		var own *pki.CA
		if *caFile != "" || *caKey != "" {
			if *caFile == "" || *caKey == "" {
				return usagef("--ca and --ca-key go together")
			}
			certPEM, err := os.ReadFile(*caFile)
			if err != nil {
				return err
			}
			keyPEM, err := os.ReadFile(*caKey)
			if err != nil {
				return err
			}
			if own, err = pki.ParseCA(certPEM, keyPEM); err != nil {
				return store.Errorf(store.CodeInvalid, "--ca %s: %w", *caFile, err)
			}
		}
		f, err := storagenode.InitFleetTLS(authDir, own)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "fleet CA %s (%s) in %s\n", pki.Fingerprint(f.CA.Cert), f.CA.Cert.Subject.CommonName, filepath.Join(authDir, "tls"))
		fmt.Fprintln(c.stdout, "next: copy the auth dir to every storage node and restart them; then give every box credentials that carry the CA (control creds issue, or an invite)")
		return nil
	}
}

func setupTLSShow(fs *flag.FlagSet) func(*call) error {
	dir := authDirFlags(fs)
	return func(c *call) error {
		authDir, err := dir()
		if err != nil {
			return err
		}
		state, err := storagenode.CARotationState(authDir)
		if err != nil {
			return err
		}
		f, err := storagenode.LoadFleetTLS(authDir)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "issuing CA: %s (%s), valid until %s\n", pki.Fingerprint(f.CA.Cert), f.CA.Cert.Subject.CommonName, f.CA.Cert.NotAfter.Format("2006-01-02"))
		for _, ca := range f.Bundle {
			fmt.Fprintf(c.stdout, "trusted CA: %s (%s)\n", pki.Fingerprint(ca), ca.Subject.CommonName)
		}
		fmt.Fprintf(c.stdout, "generation %d, rotation %s\n", f.Generation, state)
		return nil
	}
}

// rotationSteps are the steps of `control tls rotate`, in order.
var rotationSteps = map[string]struct {
	run  func(string) (*storagenode.FleetTLS, error)
	next string
}{
	"begin": {storagenode.BeginCARotation, "copy the auth dir to every storage node and restart them one at a time; " +
		"long-running clients take the new bundle from the store within a minute, boxes offline meanwhile get it at their next start once connected; " +
		"then `control tls rotate switch`"},
	"switch": {storagenode.SwitchCA, "copy the auth dir to every storage node and restart them one at a time: each moves to a certificate of the new CA; " +
		"then `control tls rotate finish`"},
	"finish": {storagenode.FinishCARotation, "copy the auth dir to every storage node and restart them one at a time; " +
		"credentials issued before the rotation carry the old CA only: a box that never connected during it needs new ones"},
}

func setupTLSRotate(fs *flag.FlagSet) func(*call) error {
	dir := authDirFlags(fs)
	return func(c *call) error {
		step, ok := rotationSteps[c.args[0]]
		if !ok {
			return usagef("want a step: begin, switch or finish")
		}
		authDir, err := dir()
		if err != nil {
			return err
		}
		root, err := signers.RootFrom(authDir, "")
		if err != nil {
			return err
		}
		f, err := step.run(authDir)
		if err != nil {
			return err
		}
		var fps []string
		for _, ca := range f.Bundle {
			fps = append(fps, pki.Fingerprint(ca))
		}
		fmt.Fprintf(c.stdout, "%s: generation %d; nodes issue from %s; trusted: %s\n", c.args[0], f.Generation, pki.Fingerprint(f.CA.Cert), strings.Join(fps, ", "))
		// Clients follow the bundle in the store: publish it now rather
		// than at the first node's restart.
		err = c.withStore(func(s *store.Store) error {
			_, err := s.PublishTLSBundle(c.ctx, root, f.BundlePEM, f.Generation)
			return err
		})
		if err != nil {
			return fmt.Errorf("the auth dir moved to generation %d, but publishing its bundle failed (the first storage node restarted with it publishes it): %w", f.Generation, err)
		}
		fmt.Fprintln(c.stdout, "published the bundle for clients to follow; next: "+step.next)
		return nil
	}
}
