package storagenode

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/store"
)

// ApplyRevocations makes ns refuse every user in revoked (public key to the
// time from which its credentials are refused) and close their connections.
func (a *Auth) ApplyRevocations(ns *server.Server, revoked map[string]time.Time) error {
	res := ns.AccountResolver()
	for _, c := range []*jwt.AccountClaims{a.accountClaims(revoked), a.systemClaims(revoked), a.edgeClaims(revoked)} {
		enc, err := c.Encode(a.operatorKP)
		if err != nil {
			return fmt.Errorf("encoding account %s: %w", c.Name, err)
		}
		dec, err := jwt.DecodeAccountClaims(enc)
		if err != nil {
			return fmt.Errorf("decoding account %s: %w", c.Name, err)
		}
		acc, err := ns.LookupAccount(c.Subject)
		if err != nil {
			return fmt.Errorf("account %s: %w", c.Name, err)
		}
		// The resolver too, so a later fetch of the account keeps them.
		if res != nil {
			if err := res.Store(c.Subject, enc); err != nil {
				return fmt.Errorf("storing account %s: %w", c.Name, err)
			}
		}
		ns.UpdateAccountClaims(acc, dec)
	}
	return nil
}

// WatchRevocations makes ns apply the revocations bucket (store.WatchRevocations):
// the stored list before it returns, then every change.
func WatchRevocations(ctx context.Context, s *store.Store, ns *server.Server, a *Auth, report func(error)) (stop func(), err error) {
	return store.WatchRevocations(ctx, s, func(revoked map[string]time.Time) error {
		return a.ApplyRevocations(ns, revoked)
	}, report)
}
