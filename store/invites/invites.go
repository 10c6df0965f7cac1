// Package invites holds the rules of an invite, the single-use, expiring
// ticket that admits a new box: its token (a secret, and the CAs the box
// checks its storage node against), its minting, its redemption (each use
// once, bound to the first machine that redeems it, never after it
// expires) and its voiding when the machine goes. Enrollment
// (control/enroll), admission (control/machines) and the mesh registrar
// (meshd/registrar) each redeem an invite for their use; it sits beside
// store, below all three, so that the one rule serves them all and no
// import runs up. The store keeps the records (store.Invite) and updates
// one only at the revision it was read at: that compare-and-swap is what
// makes a use count once when boxes race.
package invites

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// DefaultTTL is how long an invite stays redeemable.
const DefaultTTL = time.Hour

// key is the key the invite of token is stored under: the hash of its
// secret, so reading the bucket does not reveal usable tokens.
func key(token string) string {
	secret, _, _ := strings.Cut(token, ".")
	sum := sha256.Sum256([]byte(secret))
	return "invite." + hex.EncodeToString(sum[:])
}

// An invite token is "epinv_<secret>" (store.InviteTokenPrefix) or, for
// a fleet whose storage nodes speak TLS, "epinv_<secret>.<ca>[,<ca>...]":
// each <ca> the base64url SHA-256 of a CA certificate a joining box
// accepts its storage node's certificate under. The box checks the CA it
// is handed against them before it sends anything; only the secret's hash
// is stored. A third part, "<secret>.<cas>.<store>", names the storage
// nodes' URLs for `control join` (base64url of the comma-separated list):
// where to go, not whom to trust, which the CAs alone say.

// WithCAs returns token naming the CAs of fingerprints (hex SHA-256,
// pki.Fingerprint) for a joining box to check.
func WithCAs(token string, fingerprints []string) string {
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

// CAs returns the CA fingerprints (hex SHA-256) token names; none for a
// token of a fleet without TLS.
func CAs(token string) ([]string, error) {
	_, cas, ok := strings.Cut(token, ".")
	if !ok {
		return nil, nil
	}
	cas, _, _ = strings.Cut(cas, ".")
	var out []string
	for _, c := range strings.Split(cas, ",") {
		raw, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || len(raw) != sha256.Size {
			return nil, store.Errorf(store.CodeInvalid, "invite token: %q is not a CA fingerprint", c)
		}
		out = append(out, hex.EncodeToString(raw))
	}
	return out, nil
}

// WithStore returns token, which names the fleet's CAs (WithCAs), naming
// the storage nodes' URLs too.
func WithStore(token string, urls []string) string {
	if len(urls) == 0 || strings.Count(token, ".") != 1 {
		return token
	}
	return token + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Join(urls, ",")))
}

// StoreURLs returns the storage nodes' URLs token names (WithStore), comma-
// separated; "" when it names none.
func StoreURLs(token string) (string, error) {
	parts := strings.Split(token, ".")
	if len(parts) < 3 {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(parts) > 3 {
		return "", store.Errorf(store.CodeInvalid, "invite token: its store URLs (%q) are not readable", parts[2])
	}
	return string(raw), nil
}

// Spec is what an invite admits a machine with.
type Spec struct {
	Region string
	Labels map[string]string
	// Address, if set, pins the address the machine is admitted at.
	Address string
	// TTL is how long the invite stays redeemable (DefaultTTL if 0).
	TTL time.Duration
}

// Create stores a single-use invite for spec in s and returns its token.
// Only the token's hash is stored. An invite is made only while the
// store has its quorum: one written to a minority could be lost.
func Create(ctx context.Context, s *store.Store, spec Spec) (string, *store.Invite, error) {
	ttl := spec.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if spec.Region != "" && !store.ValidRegion(spec.Region) {
		return "", nil, store.Errorf(store.CodeInvalid, "invite region %q is not a region name: one lower-case DNS label", spec.Region).With("region", spec.Region)
	}
	if spec.Address != "" && net.ParseIP(spec.Address) == nil {
		return "", nil, store.Errorf(store.CodeInvalid, "invite address %q is not an IP address", spec.Address).With("address", spec.Address)
	}
	if err := s.RequireQuorum(ctx); err != nil {
		return "", nil, err
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, fmt.Errorf("creating invite: %w", err)
	}
	token := store.InviteTokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	now := time.Now().UTC()
	inv := &store.Invite{Version: store.RecordVersion, Region: spec.Region, Labels: spec.Labels, Address: spec.Address, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	// The per-key TTL removes unused invites; a little slack past ExpiresAt
	// keeps the record readable for a clear "expired" answer near the edge.
	if err := s.CreateInviteRecord(ctx, key(token), inv, ttl+time.Minute); err != nil {
		return "", nil, err
	}
	return token, inv, nil
}

// Redeem spends token for machine's use (store.InviteUseEnroll, ...). The
// first redemption binds the invite to machine; later ones succeed only for
// the same machine and a use it was not yet redeemed for (its agent and its
// meshd share one invite), so one invite never gives two sets of
// credentials, two admissions or two registrations. Each of checks may
// refuse the invite as read, before anything is spent.
func Redeem(ctx context.Context, s *store.Store, token, machine, use string, checks ...func(*store.Invite) error) (*store.Invite, error) {
	if !strings.HasPrefix(token, store.InviteTokenPrefix) {
		return nil, &store.Error{Code: store.CodeInvalid, Message: "not an edgeplane invite token (want the output of `control machine invite`)"}
	}
	switch use {
	case store.InviteUseEnroll, store.InviteUseAdmit, store.InviteUseMesh:
	default:
		return nil, store.Errorf(store.CodeInvalid, "an invite is not redeemed for %q", use)
	}
	k := key(token)
	inv, rev, err := s.InviteRecord(ctx, k)
	if err != nil {
		if store.HasCode(err, store.CodeNotFound) {
			return nil, &store.Error{Code: store.CodeNotFound, Message: "invite unknown or expired; create a new one with `control machine invite`"}
		}
		return nil, err
	}
	now := time.Now()
	if now.After(inv.ExpiresAt) {
		return nil, &store.Error{Code: store.CodeInvalid, Message: "invite expired at " + inv.ExpiresAt.Format(time.RFC3339),
			Detail: map[string]string{"expired_at": inv.ExpiresAt.Format(time.RFC3339)}}
	}
	switch {
	case inv.UsedBy != "" && inv.UsedBy != machine:
		return nil, &store.Error{Code: store.CodeConflict, Message: "invite already used by machine " + inv.UsedBy,
			Detail: map[string]string{"used_by": inv.UsedBy}}
	case slices.Contains(inv.Uses, use):
		return nil, &store.Error{Code: store.CodeConflict, Message: fmt.Sprintf("invite already redeemed (%s) by machine %s: an invite admits one box once; create a new one with `control machine invite`", use, inv.UsedBy),
			Detail: map[string]string{"used_by": inv.UsedBy, "use": use}}
	}
	for _, check := range checks {
		if err := check(inv); err != nil {
			return nil, err
		}
	}
	if inv.UsedBy == "" {
		inv.UsedBy, inv.UsedAt = machine, now.UTC()
	}
	inv.Uses = append(inv.Uses, use)
	// Written only at the revision read: of two redemptions racing, one
	// is stored and the other refused, never both.
	if err := s.UpdateInviteRecord(ctx, k, inv, rev); err != nil {
		if store.HasCode(err, store.CodeConflict) {
			return nil, &store.Error{Code: store.CodeConflict, Message: "invite was redeemed concurrently"}
		}
		return nil, fmt.Errorf("redeeming invite: %w", err)
	}
	return inv, nil
}

// VoidOf deletes the invites machine redeemed, so none admits it again,
// and returns how many there were.
func VoidOf(ctx context.Context, s *store.Store, machine string) (int, error) {
	n := 0
	err := s.ListInviteRecords(ctx, func(k string, inv *store.Invite) error {
		if inv.UsedBy != machine {
			return nil
		}
		if err := s.DeleteInviteRecord(ctx, k); err != nil {
			return fmt.Errorf("voiding the invite of machine %s: %w", machine, err)
		}
		n++
		return nil
	})
	return n, err
}
