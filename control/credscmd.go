package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// setupCredsIssue issues role-scoped NATS credentials. It runs on a
// storage node: signing needs the account key in the auth dir, which only
// storage nodes hold. Credentials are self-contained JWTs, so every storage
// node accepts them at once; the issued key is recorded in the store
// (`control creds ls`, revoked by `control machine rm`) when the store
// answers, and the command says so when it does not.
func setupCredsIssue(fs *flag.FlagSet) func(*call) error {
	role := fs.String("role", "", "role: "+strings.Join(storagenode.Roles, ", ")+" (required)")
	machine := fs.String("machine", "", "machine ID, required for the agent and mesh roles; for the gateway role (required too) the gateway_name it reports under")
	name := fs.String("name", "", "user name shown in server monitoring (default role-machine)")
	data := fs.String("data", "", "the storage node's data dir (its auth dir is DATA/auth)")
	authDir := fs.String("auth-dir", "", "auth dir (overrides --data)")
	file := fs.String("o", "", "write the credentials here, mode 0600 (required; - for stdout)")
	ttl := fs.Duration("ttl", 0, fmt.Sprintf("expire the credentials after this long (default: %s for the agent, mesh and gateway roles, which renew their own while they run; no expiry for control)", storagenode.DefaultCredsTTL))
	system := fs.Bool("system", false, "a system-account user, for server operations NATS reserves to it ('control storage forget' issues its own)")
	return func(c *call) error {
		if *role == "" && !*system {
			return usagef("--role is required (%s)", strings.Join(storagenode.Roles, ", "))
		}
		if *file == "" {
			return usagef("-o FILE is required")
		}
		dir := *authDir
		if dir == "" {
			if *data == "" {
				return usagef("--data DIR or --auth-dir DIR is required (run this on a storage node)")
			}
			dir = filepath.Join(*data, "auth")
		}
		names, err := store.NewNames(c.client.Installation, c.client.Authority)
		if err != nil {
			return usagef("%v", err)
		}
		a, err := storagenode.LoadAuth(dir, false)
		if err != nil {
			return err
		}
		r := *role
		if *system && r == "" {
			r = storagenode.RoleControl
		}
		life := *ttl
		if life == 0 && !*system && r != storagenode.RoleControl {
			life = storagenode.DefaultCredsTTL
		}
		b, err := a.IssueCreds(storagenode.CredsRequest{Role: r, Machine: *machine, Name: *name, Names: names, TTL: life, System: *system})
		if err != nil {
			return err
		}
		recordIssued(c, b)
		if *file == "-" {
			_, err = c.stdout.Write(b)
			return err
		}
		// Written whole into a new file, so an existing file's wider mode
		// (or its other links) never carries over to the secret.
		if err := atomicfile.Write(*file, b, 0o600); err != nil {
			return fmt.Errorf("writing credentials: %w", err)
		}
		exp := "never"
		if life > 0 {
			exp = time.Now().Add(life).UTC().Format(time.RFC3339)
		}
		who := r
		if *machine != "" {
			who += " for machine " + *machine
		}
		fmt.Fprintf(c.stdout, "wrote %s credentials to %s (expires %s)\n", who, *file, exp)
		return nil
	}
}

// setupCredsRevoke refuses one user's credentials from now on, on every
// storage node: it records the revocation in the store, which each node
// applies and which closes the user's open connections.
func setupCredsRevoke(fs *flag.FlagSet) func(*call) error {
	userCreds := fs.String("user-creds", "", "the credentials file to revoke")
	user := fs.String("user", "", "or the user public key (U...) to revoke")
	reason := fs.String("reason", "", "why, recorded with the revocation")
	return func(c *call) error {
		if (*userCreds == "") == (*user == "") {
			return usagef("give exactly one of --user-creds FILE or --user UKEY")
		}
		rev := &store.Revocation{User: *user}
		if *userCreds != "" {
			b, err := os.ReadFile(*userCreds)
			if err != nil {
				return fmt.Errorf("reading %s: %w", *userCreds, err)
			}
			if rev, err = store.UserOfCreds(b); err != nil {
				return err
			}
		}
		rev.Reason = *reason
		if err := c.withStore(func(s *store.Store) error { return s.RevokeUser(c.ctx, rev) }); err != nil {
			return err
		}
		return c.out.emit(rev, func(w io.Writer) {
			who := rev.Name
			if who == "" {
				who = rev.User
			}
			fmt.Fprintf(w, "revoked %s (%s) at %s: storage nodes refuse it and close its connections\n", who, rev.User, rev.At.Format(time.RFC3339))
		})
	}
}

// recordIssued records the key of creds in the store, for `control creds
// ls` and `control machine rm`; a store that does not answer (a node not
// started yet) is said, not fatal: the credentials are good all the same.
func recordIssued(c *call, creds []byte) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return
	}
	rec, err := store.CredentialOfJWT(tok, store.IssuedByCommand)
	if err == nil {
		err = c.withStore(func(s *store.Store) error { return s.RecordCredential(c.ctx, rec) })
	}
	if err != nil {
		fmt.Fprintf(c.stderr, "warning: the issued key %s is not recorded in the store (%v): `control creds ls` does not show it and `control machine rm` does not revoke it\n", rec.User, err)
	}
}

// setupCredsList lists the recorded keys issued to boxes.
func setupCredsList(fs *flag.FlagSet) func(*call) error {
	machine := fs.String("machine", "", "only this machine's keys")
	role := fs.String("role", "", "only this role's keys")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := s.ListCredentials(c.ctx, *machine, *role)
			if err != nil {
				return err
			}
			return c.out.emit(list, func(w io.Writer) { printers.Credentials(w, list) })
		})
	}
}
