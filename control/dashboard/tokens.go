package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Login tokens. `control dashboard token create` makes one and shows it
// once; the store keeps only its SHA-256 (a token is 32 random bytes, so a
// fast hash is as good as a slow one), under the token's ID.

// tokenPrefix starts every token, so that one pasted somewhere it should
// not be is recognisable.
const tokenPrefix = "epd_"

// NewToken makes a login token named name: the string to hand to the
// operator, and the record to store (store.PutDashboardToken).
func NewToken(name string) (string, *store.DashboardToken, error) {
	var id [6]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", nil, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", nil, err
	}
	rec := &store.DashboardToken{Version: store.RecordVersion, ID: hex.EncodeToString(id[:]), Name: name, CreatedAt: time.Now().UTC()}
	sec := base64.RawURLEncoding.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(sec))
	rec.Hash = hex.EncodeToString(sum[:])
	return tokenPrefix + rec.ID + "." + sec, rec, nil
}

// ParseToken splits a login token into its ID and secret.
func ParseToken(token string) (id, secret string, err error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), tokenPrefix)
	if ok {
		id, secret, ok = strings.Cut(rest, ".")
	}
	if !ok || !store.ValidToken(id) || secret == "" {
		return "", "", store.Errorf(store.CodeInvalid, "not a dashboard token")
	}
	return id, secret, nil
}

// CheckToken returns the stored token that token is, or an unauthorized
// error (the same whether the ID or the secret is wrong).
func CheckToken(ctx context.Context, s *store.Store, token string) (*store.DashboardToken, error) {
	refused := store.Errorf(store.CodeUnauthorized, "unknown or revoked dashboard token")
	id, secret, err := ParseToken(token)
	if err != nil {
		return nil, refused
	}
	rec, err := s.DashboardTokenRecord(ctx, id)
	if err != nil {
		if store.HasCode(err, store.CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	sum := sha256.Sum256([]byte(secret))
	want, err := hex.DecodeString(rec.Hash)
	if err != nil || subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return nil, refused
	}
	return rec, nil
}

// Sessions. A login exchanges a token for a session: a random ID the
// browser keeps in its cookie, never the token itself, so a cookie that
// leaks (a proxy's log, a stolen browser profile) is worth one session
// until it expires, not the token until someone revokes it. The store
// keeps a session under the SHA-256 of its ID (sessionKey), with a TTL of
// its own, so every dashboard of the fleet knows it and it outlives a
// dashboard's restart, and reading the bucket gives no one a cookie.

// sessionKey is the key a session ID is filed under.
func sessionKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// openSession opens a session for tok lasting ttl and returns its ID, for
// the browser's cookie.
func openSession(ctx context.Context, s *store.Store, tok *store.DashboardToken, ttl time.Duration) (string, *store.DashboardSession, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, err
	}
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	now := time.Now().UTC()
	rec := &store.DashboardSession{Version: store.RecordVersion, Key: sessionKey(id), Token: tok.ID, Name: tok.Name, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	// The key goes a little after the session ends; the record's own
	// expiry is what the check goes by.
	if err := s.PutDashboardSessionRecord(ctx, rec, ttl+time.Minute); err != nil {
		return "", nil, err
	}
	return id, rec, nil
}

// checkSession returns the session id names if it is open: known, not
// expired, and its token not revoked; else an unauthorized error.
func checkSession(ctx context.Context, s *store.Store, id string) (*store.DashboardSession, error) {
	refused := store.Errorf(store.CodeUnauthorized, "unknown, expired or revoked dashboard session")
	if len(id) < 32 || len(id) > 64 {
		return nil, refused
	}
	rec, err := s.DashboardSessionRecord(ctx, sessionKey(id))
	if err != nil {
		if store.HasCode(err, store.CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	if !time.Now().Before(rec.ExpiresAt) {
		return nil, refused
	}
	tok, err := s.DashboardTokenRecord(ctx, rec.Token)
	if err != nil {
		if store.HasCode(err, store.CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	if !tok.CreatedAt.IsZero() && tok.CreatedAt.After(rec.CreatedAt) {
		// A token made after the session is not the one it was opened
		// with.
		return nil, refused
	}
	return rec, nil
}

// endSession ends the session id names (a logout); ending one that is not
// there is no error.
func endSession(ctx context.Context, s *store.Store, id string) error {
	return s.DeleteDashboardSessionRecord(ctx, sessionKey(id))
}
