package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InviteTokenPrefix marks edgeplane invite tokens so a pasted token of the
// wrong kind fails with a clear message.
const InviteTokenPrefix = "epinv_"

// DefaultInviteTTL is how long an invite stays redeemable.
const DefaultInviteTTL = time.Hour

func inviteKey(token string) string {
	secret, _, _ := strings.Cut(token, ".")
	sum := sha256.Sum256([]byte(secret))
	return "invite." + hex.EncodeToString(sum[:])
}

// An invite token is "epinv_<secret>" or, for a fleet whose storage nodes
// speak TLS, "epinv_<secret>.<ca>[,<ca>...]": each <ca> the base64url
// SHA-256 of a CA certificate a joining box accepts its storage node's
// certificate under. The box checks the CA it is handed against them before
// it sends anything; only the secret's hash is stored.

// InviteWithCAs returns token naming the CAs of fingerprints (hex SHA-256,
// pki.Fingerprint) for a joining box to check.
func InviteWithCAs(token string, fingerprints []string) string {
	if len(fingerprints) == 0 {
		return token
	}
	parts := make([]string, 0, len(fingerprints))
	for _, fp := range fingerprints {
		raw, err := hex.DecodeString(fp)
		if err != nil {
			continue
		}
		parts = append(parts, base64.RawURLEncoding.EncodeToString(raw))
	}
	return token + "." + strings.Join(parts, ",")
}

// InviteCAs returns the CA fingerprints (hex SHA-256) token names; none for
// a token of a fleet without TLS.
func InviteCAs(token string) ([]string, error) {
	_, cas, ok := strings.Cut(token, ".")
	if !ok {
		return nil, nil
	}
	var out []string
	for _, c := range strings.Split(cas, ",") {
		raw, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || len(raw) != sha256.Size {
			return nil, Errorf(CodeInvalid, "invite token: %q is not a CA fingerprint", c)
		}
		out = append(out, hex.EncodeToString(raw))
	}
	return out, nil
}

// InviteSpec is what an invite admits a machine with.
type InviteSpec struct {
	Region string
	Labels map[string]string
	// Address, if set, pins the address the machine is admitted at.
	Address string
	// TTL is how long the invite stays redeemable (DefaultInviteTTL if 0).
	TTL time.Duration
}

// CreateInvite stores a single-use invite and returns its token. Only the
// token's hash is stored.
func (s *Store) CreateInvite(ctx context.Context, region string, labels map[string]string, ttl time.Duration) (string, *Invite, error) {
	return s.CreateInviteFor(ctx, InviteSpec{Region: region, Labels: labels, TTL: ttl})
}

// CreateInviteFor is CreateInvite with every field of spec.
func (s *Store) CreateInviteFor(ctx context.Context, spec InviteSpec) (string, *Invite, error) {
	ttl := spec.TTL
	if ttl <= 0 {
		ttl = DefaultInviteTTL
	}
	if spec.Address != "" && net.ParseIP(spec.Address) == nil {
		return "", nil, Errorf(CodeInvalid, "invite address %q is not an IP address", spec.Address).With("address", spec.Address)
	}
	if err := s.RequireQuorum(ctx); err != nil {
		return "", nil, err
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, fmt.Errorf("creating invite: %w", err)
	}
	token := InviteTokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	now := time.Now().UTC()
	inv := &Invite{Version: RecordVersion, Region: spec.Region, Labels: spec.Labels, Address: spec.Address, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	data, _ := json.Marshal(inv)
	// The per-key TTL removes unused invites; a little slack past ExpiresAt
	// keeps the record readable for a clear "expired" answer near the edge.
	if _, err := s.invites.Create(ctx, inviteKey(token), data, jetstream.KeyTTL(ttl+time.Minute)); err != nil {
		return "", nil, classify(fmt.Errorf("storing invite: %w", err))
	}
	return token, inv, nil
}

// What an invite is redeemed for. A box redeems its invite once for each:
// its enrollment (credentials for its keys), its agent's admission (the
// machine record) and its meshd's registration. The first redemption binds
// the invite to the machine.
const (
	InviteUseEnroll = "enroll"
	InviteUseAdmit  = "admit"
	InviteUseMesh   = "mesh"
)

// RedeemInvite spends token for machine's use (InviteUseEnroll, ...). The
// first redemption binds the invite to machine; later ones succeed only for
// the same machine and a use it was not yet redeemed for (its agent and its
// meshd share one invite), so one invite never gives two sets of
// credentials, two admissions or two registrations. Each of checks may
// refuse the invite as read, before anything is spent.
func (s *Store) RedeemInvite(ctx context.Context, token, machine, use string, checks ...func(*Invite) error) (*Invite, error) {
	if !strings.HasPrefix(token, InviteTokenPrefix) {
		return nil, &Error{Code: CodeInvalid, Message: "not an edgeplane invite token (want the output of `control machine invite`)"}
	}
	switch use {
	case InviteUseEnroll, InviteUseAdmit, InviteUseMesh:
	default:
		return nil, Errorf(CodeInvalid, "an invite is not redeemed for %q", use)
	}
	key := inviteKey(token)
	var inv Invite
	rev, err := GetJSON(ctx, s.invites, key, &inv)
	if err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, &Error{Code: CodeNotFound, Message: "invite unknown or expired; create a new one with `control machine invite`"}
		}
		return nil, err
	}
	now := time.Now()
	if now.After(inv.ExpiresAt) {
		return nil, &Error{Code: CodeInvalid, Message: "invite expired at " + inv.ExpiresAt.Format(time.RFC3339),
			Detail: map[string]string{"expired_at": inv.ExpiresAt.Format(time.RFC3339)}}
	}
	switch {
	case inv.UsedBy != "" && inv.UsedBy != machine:
		return nil, &Error{Code: CodeConflict, Message: "invite already used by machine " + inv.UsedBy,
			Detail: map[string]string{"used_by": inv.UsedBy}}
	case slices.Contains(inv.Uses, use):
		return nil, &Error{Code: CodeConflict, Message: fmt.Sprintf("invite already redeemed (%s) by machine %s: an invite admits one box once; create a new one with `control machine invite`", use, inv.UsedBy),
			Detail: map[string]string{"used_by": inv.UsedBy, "use": use}}
	}
	for _, check := range checks {
		if err := check(&inv); err != nil {
			return nil, err
		}
	}
	if inv.UsedBy == "" {
		inv.UsedBy, inv.UsedAt = machine, now.UTC()
	}
	inv.Uses = append(inv.Uses, use)
	data, _ := json.Marshal(inv)
	if _, err := s.invites.Update(ctx, key, data, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, &Error{Code: CodeConflict, Message: "invite was redeemed concurrently"}
		}
		return nil, classify(fmt.Errorf("redeeming invite: %w", err))
	}
	return &inv, nil
}

// VoidInvitesOf deletes the invites machine redeemed, so none admits it
// again, and returns how many there were.
func (s *Store) VoidInvitesOf(ctx context.Context, machine string) (int, error) {
	n := 0
	err := ListJSON(ctx, s, s.invites, ">", func(key string, inv *Invite) error {
		if inv.UsedBy != machine {
			return nil
		}
		if err := s.invites.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return classify(fmt.Errorf("voiding the invite of machine %s: %w", machine, err))
		}
		n++
		return nil
	})
	return n, err
}
