package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// UserRevoked says whether the credentials of user (a public user key,
// U...) are revoked: whether a Revocation is recorded for it, whatever
// its body says.
func (s *Store) UserRevoked(ctx context.Context, user string) (bool, error) {
	if _, err := s.revocations.Get(ctx, user); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		return false, classify(fmt.Errorf("reading the revocation of %s: %w", user, err))
	}
	return true, nil
}
