package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Revocation records that a user's credentials are refused from At on.
// Credentials are self-contained JWTs, so refusing one takes a list every
// storage node applies: the revocations bucket, replicated like every other,
// read again from its history when a node restarts.
type Revocation struct {
	Version int `json:"version"`
	// User is the credentials' public user key (U...).
	User    string    `json:"user"`
	Name    string    `json:"name,omitempty"`
	Role    string    `json:"role,omitempty"`
	Machine string    `json:"machine,omitempty"`
	At      time.Time `json:"at"`
	Reason  string    `json:"reason,omitempty"`
	// Expires, if set, is when the revoked credentials expire: from then
	// on storage nodes refuse them without the revocation, which they
	// leave out of the accounts (a fleet renewing its credentials revokes
	// a key per box and role at every renewal).
	Expires time.Time `json:"expires,omitzero"`
}

func (r *Revocation) version() int { return r.Version }

// UserOfCreds reads whom a credentials file names, as a Revocation to fill
// in.
func UserOfCreds(creds []byte) (*Revocation, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return nil, Errorf(CodeInvalid, "reading credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, Errorf(CodeInvalid, "reading credentials: %w", err)
	}
	return userOfClaims(uc)
}

// userOfClaims reads whom a user JWT names: its key, name, role and
// machine tags.
func userOfClaims(uc *jwt.UserClaims) (*Revocation, error) {
	r := &Revocation{User: uc.Subject, Name: uc.Name}
	for _, tag := range uc.Tags {
		if k, v, ok := strings.Cut(tag, ":"); ok {
			switch k {
			case "role":
				r.Role = v
			case "machine":
				r.Machine = v
			}
		}
	}
	return r, nil
}

// RevokeUser records rev (At defaults to now). Storage nodes then refuse the
// user's credentials and close its connections.
func (s *Store) RevokeUser(ctx context.Context, rev *Revocation) error {
	if !nkeys.IsValidPublicUserKey(rev.User) {
		return Errorf(CodeInvalid, "%q is not a user public key (U...)", rev.User).With("user", rev.User)
	}
	if err := s.RequireQuorum(ctx); err != nil {
		return err
	}
	rev.Version = RecordVersion
	if rev.At.IsZero() {
		rev.At = time.Now().UTC()
	}
	_, err := PutJSON(ctx, s.revocations, rev.User, rev)
	return err
}

// WatchRevocations hands the revocations bucket to apply (public key to the
// time from which its credentials are refused): its whole content before it
// returns, so a storage node refuses revoked credentials from the moment it
// reports ready, then the whole list again on every change until ctx ends or
// stop is called. A record that cannot be taken, and errors of later
// changes, go to report; the watch goes on.
func WatchRevocations(ctx context.Context, s *Store, apply func(revoked map[string]time.Time) error, report func(error)) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := s.revocations.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, classify(fmt.Errorf("watching revocations: %w", err))
	}
	revoked := map[string]time.Time{}
	// take folds one entry into revoked. A record that is not one user's
	// revocation under that user's key is skipped and reported: above all
	// a wildcard user, which NATS reads as "every user".
	take := func(ent jetstream.KeyValueEntry) error {
		if ent.Operation() != jetstream.KeyValuePut {
			delete(revoked, ent.Key())
			return nil
		}
		var r Revocation
		if err := DecodeKeyed(s.revocations.Bucket(), ent.Key(), ent.Value(), &r); err != nil {
			return fmt.Errorf("skipping revocation: %w", err)
		}
		if !nkeys.IsValidPublicUserKey(r.User) {
			return fmt.Errorf("skipping revocation under %q: %q is not one user's public key", ent.Key(), r.User)
		}
		if !r.Expires.IsZero() && time.Now().After(r.Expires) {
			delete(revoked, r.User)
			return nil
		}
		revoked[r.User] = r.At
		return nil
	}
	fail := func(err error) (func(), error) {
		w.Stop()
		cancel()
		return nil, err
	}
	for caughtUp := false; !caughtUp; {
		select {
		case <-ctx.Done():
			return fail(classify(fmt.Errorf("reading revocations: %w", ctx.Err())))
		case ent, ok := <-w.Updates():
			switch {
			case !ok:
				return fail(fmt.Errorf("reading revocations: watcher closed"))
			case ent == nil:
				caughtUp = true
			default:
				if err := take(ent); err != nil {
					report(err)
				}
			}
		}
	}
	if len(revoked) > 0 {
		if err := apply(revoked); err != nil {
			return fail(fmt.Errorf("applying %d revocations: %w", len(revoked), err))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ent, ok := <-w.Updates():
				if !ok {
					return
				}
				if ent == nil {
					continue
				}
				if err := take(ent); err != nil {
					report(err)
					continue
				}
				if err := apply(revoked); err != nil {
					report(fmt.Errorf("applying %d revocations: %w", len(revoked), err))
				}
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}
