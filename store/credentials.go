package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// How a box's credentials were issued (CredentialRecord.How).
const (
	// IssuedByEnrollment: an invited box's enrollment (its own keys).
	IssuedByEnrollment = "enrollment"
	// IssuedByCommand: `control creds issue` on a storage node.
	IssuedByCommand = "issue"
	// IssuedByRenewal: a running box renewing its own credentials.
	IssuedByRenewal = "renewal"
)

// CredentialRecord is one user key issued to a box, kept so that an
// operator can find every key a machine holds (`control creds ls`) and
// `control machine rm` can revoke them all. The key is the user public key.
type CredentialRecord struct {
	Version int `json:"version"`
	// User is the public user key (U...) the JWT was issued for.
	User    string `json:"user"`
	Role    string `json:"role"`
	Machine string `json:"machine,omitempty"`
	Name    string `json:"name,omitempty"`
	// How is IssuedByEnrollment, IssuedByCommand or IssuedByRenewal.
	How       string    `json:"how"`
	IssuedAt  time.Time `json:"issued_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RenewedFrom is the key this one replaced (a renewal).
	RenewedFrom string `json:"renewed_from,omitempty"`
	// Inbox is the key whose inbox the credentials answer on: the first
	// key of a line of renewals, so a running process keeps its reply
	// subjects across a switch (InboxPrefix).
	Inbox string `json:"inbox,omitempty"`
}

func (r *CredentialRecord) version() int { return r.Version }

// KeyOK checks the record is filed under its user key.
func (r *CredentialRecord) KeyOK(key string) error { return keyMust(key, r.User) }

// CredentialOfJWT is the record of a user JWT: who, which role and
// machine, when issued and until when.
func CredentialOfJWT(userJWT, how string) (*CredentialRecord, error) {
	uc, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return nil, Errorf(CodeInvalid, "reading credentials: %w", err)
	}
	r := &CredentialRecord{Version: RecordVersion, User: uc.Subject, Name: uc.Name, How: how,
		IssuedAt: time.Unix(uc.IssuedAt, 0).UTC()}
	if uc.Expires > 0 {
		r.ExpiresAt = time.Unix(uc.Expires, 0).UTC()
	}
	rev, err := userOfClaims(uc)
	if err != nil {
		return nil, err
	}
	r.Role, r.Machine = rev.Role, rev.Machine
	r.Inbox = InboxKeyOf(uc)
	return r, nil
}

// RecordCredential records rec (from CredentialOfJWT). A key is recorded
// once: keys are made fresh for every credential.
func (s *Store) RecordCredential(ctx context.Context, rec *CredentialRecord) error {
	if !nkeys.IsValidPublicUserKey(rec.User) {
		return Errorf(CodeInvalid, "%q is not a user public key (U...)", rec.User).With("user", rec.User)
	}
	rec.Version = RecordVersion
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.credentials.Create(ctx, rec.User, data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Errorf(CodeConflict, "user key %s is already recorded", rec.User).With("user", rec.User)
		}
		return classify(fmt.Errorf("recording credentials of %s: %w", rec.User, err))
	}
	return nil
}

// Credential reads the record of user key user (not_found if none).
func (s *Store) Credential(ctx context.Context, user string) (*CredentialRecord, error) {
	var rec CredentialRecord
	if _, err := GetJSON(ctx, s.credentials, user, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// IssuedCredential is a recorded key with its revocation, if any.
type IssuedCredential struct {
	CredentialRecord
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// ListCredentials returns the recorded keys of machine and role ("" for
// any), each with its revocation, oldest first.
func (s *Store) ListCredentials(ctx context.Context, machine, role string) ([]IssuedCredential, error) {
	revoked := map[string]time.Time{}
	err := ListJSON(ctx, s, s.revocations, ">", func(_ string, r *Revocation) error {
		revoked[r.User] = r.At
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []IssuedCredential
	err = ListJSON(ctx, s, s.credentials, ">", func(_ string, r *CredentialRecord) error {
		if (machine != "" && r.Machine != machine) || (role != "" && r.Role != role) {
			return nil
		}
		out = append(out, IssuedCredential{CredentialRecord: *r, RevokedAt: revoked[r.User]})
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].IssuedAt.Before(out[j].IssuedAt) })
	return out, err
}

// RevokeMachineCredentials revokes every recorded key of machine not
// revoked yet, with reason, and returns how many it revoked.
func (s *Store) RevokeMachineCredentials(ctx context.Context, machine, reason string) (int, error) {
	creds, err := s.ListCredentials(ctx, machine, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range creds {
		if !c.RevokedAt.IsZero() {
			continue
		}
		if err := s.RevokeUser(ctx, &Revocation{User: c.User, Name: c.Name, Role: c.Role, Machine: c.Machine, Reason: reason, Expires: c.ExpiresAt}); err != nil {
			return n, fmt.Errorf("revoking %s credentials %s of machine %s: %w", c.Role, c.User, machine, err)
		}
		n++
	}
	return n, nil
}
