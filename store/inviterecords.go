package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Invite records, as stored. The rules of an invite (its token, its
// single use per purpose, its binding to one machine, its expiry) are
// package invites' (store/invites); the store keeps the records under the
// key invites derives from the token, and updates one only at the revision
// it was read at, which is what makes each use count once.

// InviteTokenPrefix starts every invite token (package invites makes and
// reads them), so a pasted token of the wrong kind fails with a clear
// message wherever it is read.
const InviteTokenPrefix = "epinv_"

// What an invite is redeemed for (Invite.Uses). A box redeems its invite
// once for each: its enrollment (credentials for its keys), its agent's
// admission (the machine record) and its meshd's registration.
const (
	InviteUseEnroll = "enroll"
	InviteUseAdmit  = "admit"
	InviteUseMesh   = "mesh"
)

// CreateInviteRecord stores a new invite under key, its key removed by the
// store after keyTTL; a key taken already is refused.
func (s *Store) CreateInviteRecord(ctx context.Context, key string, inv *Invite, keyTTL time.Duration) error {
	data, err := json.Marshal(inv)
	if err != nil {
		return fmt.Errorf("encoding invite: %w", err)
	}
	if _, err := s.invites.Create(ctx, key, data, jetstream.KeyTTL(keyTTL)); err != nil {
		return classify(fmt.Errorf("storing invite: %w", err))
	}
	return nil
}

// InviteRecord reads the invite under key and the revision it is at; a
// missing one is a not_found error.
func (s *Store) InviteRecord(ctx context.Context, key string) (*Invite, uint64, error) {
	var inv Invite
	rev, err := GetJSON(ctx, s.invites, key, &inv)
	if err != nil {
		return nil, 0, err
	}
	return &inv, rev, nil
}

// UpdateInviteRecord writes inv under key only if the record there is
// still at revision rev (InviteRecord's); if anyone wrote it since, it is
// a conflict and nothing is written.
func (s *Store) UpdateInviteRecord(ctx context.Context, key string, inv *Invite, rev uint64) error {
	data, err := json.Marshal(inv)
	if err != nil {
		return fmt.Errorf("encoding invite: %w", err)
	}
	if _, err := s.invites.Update(ctx, key, data, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Errorf(CodeConflict, "invite changed since revision %d", rev).With("revision", fmt.Sprint(rev))
		}
		return classify(fmt.Errorf("updating invite: %w", err))
	}
	return nil
}

// ListInviteRecords calls fn with every stored invite and its key.
func (s *Store) ListInviteRecords(ctx context.Context, fn func(key string, inv *Invite) error) error {
	return ListJSON(ctx, s, s.invites, ">", fn)
}

// DeleteInviteRecord removes the invite under key; removing one that is not
// there is no error.
func (s *Store) DeleteInviteRecord(ctx context.Context, key string) error {
	if err := s.invites.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("deleting invite %s: %w", key, err))
	}
	return nil
}
