package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/edgeplane/edgeplane/control/fleetca"
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
		// A dir that is not an auth dir is said before the flags are.
		if _, err := storagenode.LoadAuth(authDir, false); err != nil {
			return err
		}
		if (*caFile == "") != (*caKey == "") {
			return usagef("--ca and --ca-key go together")
		}
		f, err := fleetca.Init(authDir, *caFile, *caKey)
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
		return fleetca.Show(c.stdout, authDir)
	}
}

func setupTLSRotate(fs *flag.FlagSet) func(*call) error {
	dir := authDirFlags(fs)
	return func(c *call) error {
		step, ok := fleetca.Steps[c.args[0]]
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
		f, err := step.Run(authDir)
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
		fmt.Fprintln(c.stdout, "published the bundle for clients to follow; next: "+step.Next)
		return nil
	}
}
