package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
)

// signingView is `control signing ls`'s answer.
type signingView struct {
	TrustRoot string               `json:"trust_root"`
	Source    string               `json:"trust_source"`
	Signers   []store.SignerRecord `json:"signers"`
	// Refused are certificates the trust root did not sign.
	Refused []string `json:"refused,omitempty"`
}

func setupSigningList(fs *flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			_, anchor, err := s.Trust(c.ctx)
			if err != nil {
				return err
			}
			recs, bad, err := signers.List(c.ctx, s)
			if err != nil {
				return err
			}
			v := signingView{TrustRoot: anchor.Root, Source: anchor.Source, Signers: recs}
			for _, e := range bad {
				v.Refused = append(v.Refused, e.Error())
			}
			return c.out.emit(v, func(w io.Writer) { printers.Signers(w, v.TrustRoot, v.Source, v.Signers, v.Refused) })
		})
	}
}

// rootFlags are the flags of the commands that use the trust root.
func rootFlags(fs *flag.FlagSet) func() (*signing.Key, error) {
	data := fs.String("data", "", "the storage node's data dir (the trust root is in DATA/auth)")
	authDir := fs.String("auth-dir", "", "auth dir holding the trust root (overrides --data)")
	return func() (*signing.Key, error) { return signers.RootFrom(*authDir, *data) }
}

func setupSigningIssue(fs *flag.FlagSet) func(*call) error {
	root := rootFlags(fs)
	name := fs.String("name", "", "who signs with it, shown by 'control signing ls' (required)")
	file := fs.String("o", "", "write the signer key here, mode 0600 (required; - for stdout)")
	return func(c *call) error {
		if *name == "" {
			return usagef("--name is required")
		}
		if *file == "" {
			return usagef("-o FILE is required")
		}
		r, err := root()
		if err != nil {
			return err
		}
		return c.withStore(func(s *store.Store) error {
			key, err := signers.Issue(c.ctx, s, r, *name, *file)
			if err != nil {
				return err
			}
			if *file == "-" {
				seed, err := key.Seed()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(c.stdout, string(seed))
				return err
			}
			fmt.Fprintf(c.stdout, "certified signer %s (%s); key written to %s\n", key.PublicKey(), *name, *file)
			return nil
		})
	}
}

func setupSigningRotate(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "the control server's data dir: rotates DATA/signer.nk, with the trust root in DATA/auth")
	authDir := fs.String("auth-dir", "", "auth dir holding the trust root (default DATA/auth)")
	file := fs.String("key", "", "the signer key file to rotate (default DATA/signer.nk)")
	name := fs.String("name", "", "name of the new signer (default: the old one's)")
	grace := fs.Duration("grace", signers.DefaultGrace, "how long the old signer stays valid after the new one is in place")
	return func(c *call) error {
		path := *file
		if path == "" {
			if *data == "" {
				return usagef("--data DIR or --key FILE is required")
			}
			path = filepath.Join(*data, signers.SignerFile)
		}
		r, err := signers.RootFrom(*authDir, *data)
		if err != nil {
			return err
		}
		return c.withStore(func(s *store.Store) error {
			rot, err := signers.Rotate(c.ctx, s, r, path, *name, *grace)
			if err != nil {
				return err
			}
			return c.out.emit(rot, func(w io.Writer) {
				fmt.Fprintf(w, "rotated %s: signer %s replaces %s, which is retired\n", path, rot.New, rot.Old)
			})
		})
	}
}

func setupSigningRetire(fs *flag.FlagSet) func(*call) error {
	root := rootFlags(fs)
	return func(c *call) error {
		pub := c.args[0]
		if !signing.IsSignerKey(pub) {
			return usagef("%q is not a signer public key (N...)", pub)
		}
		r, err := root()
		if err != nil {
			return err
		}
		return c.withStore(func(s *store.Store) error {
			rec, err := signers.Retire(c.ctx, s, r, pub)
			if err != nil {
				return err
			}
			return c.out.emit(rec, func(w io.Writer) {
				fmt.Fprintf(w, "retired signer %s (%s): what it signed so far stands, nothing it signs from now on does\n", rec.Key, rec.Name)
			})
		})
	}
}
