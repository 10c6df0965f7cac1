package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Dashboard login tokens. `control dashboard token create` makes one and
// shows it once; the store keeps only its SHA-256 (a token is 32 random
// bytes, so a fast hash is as good as a slow one), under the token's ID,
// in a bucket only the control role reads.

// DashboardToken is one login token as stored. Key: its ID.
type DashboardToken struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Name    string `json:"name,omitempty"`
	// Hash is the hex SHA-256 of the token's secret part.
	Hash      string    `json:"hash,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func (r *DashboardToken) version() int { return r.Version }

// KeyOK checks the token is filed under its ID.
func (r *DashboardToken) KeyOK(key string) error { return keyMust(key, r.ID) }

// dashboardTokenPrefix starts every token, so that one pasted somewhere
// it should not be is recognisable.
const dashboardTokenPrefix = "epd_"

// NewDashboardToken makes a token named name: the string to hand to the
// operator, and the record to store.
func NewDashboardToken(name string) (string, *DashboardToken, error) {
	var id [6]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", nil, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", nil, err
	}
	rec := &DashboardToken{Version: RecordVersion, ID: hex.EncodeToString(id[:]), Name: name, CreatedAt: time.Now().UTC()}
	sec := base64.RawURLEncoding.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(sec))
	rec.Hash = hex.EncodeToString(sum[:])
	return dashboardTokenPrefix + rec.ID + "." + sec, rec, nil
}

// ParseDashboardToken splits a token into its ID and secret.
func ParseDashboardToken(token string) (id, secret string, err error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), dashboardTokenPrefix)
	if ok {
		id, secret, ok = strings.Cut(rest, ".")
	}
	if !ok || !ValidToken(id) || secret == "" {
		return "", "", Errorf(CodeInvalid, "not a dashboard token")
	}
	return id, secret, nil
}

// PutDashboardToken stores rec; an ID taken already is refused.
func (s *Store) PutDashboardToken(ctx context.Context, rec *DashboardToken) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.DashboardTokens.Create(ctx, rec.ID, data); err != nil {
		return classify(fmt.Errorf("storing dashboard token %s: %w", rec.ID, err))
	}
	return nil
}

// ListDashboardTokens lists the stored tokens (never their secrets).
func (s *Store) ListDashboardTokens(ctx context.Context) ([]DashboardToken, error) {
	var out []DashboardToken
	err := ListJSON(ctx, s, s.DashboardTokens, ">", func(_ string, r *DashboardToken) error {
		out = append(out, *r)
		return nil
	})
	return out, err
}

// DeleteDashboardToken revokes the token with id.
func (s *Store) DeleteDashboardToken(ctx context.Context, id string) error {
	if _, err := s.DashboardTokens.Get(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Errorf(CodeNotFound, "no dashboard token %s", id).With("id", id)
		}
		return classify(fmt.Errorf("reading dashboard token %s: %w", id, err))
	}
	if err := s.DashboardTokens.Delete(ctx, id); err != nil {
		return classify(fmt.Errorf("deleting dashboard token %s: %w", id, err))
	}
	return nil
}

// CheckDashboardToken returns the stored token that token is, or an
// unauthorized error (the same whether the ID or the secret is wrong).
func (s *Store) CheckDashboardToken(ctx context.Context, token string) (*DashboardToken, error) {
	refused := Errorf(CodeUnauthorized, "unknown or revoked dashboard token")
	id, secret, err := ParseDashboardToken(token)
	if err != nil {
		return nil, refused
	}
	var rec DashboardToken
	if _, err := GetJSON(ctx, s.DashboardTokens, id, &rec); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	sum := sha256.Sum256([]byte(secret))
	want, err := hex.DecodeString(rec.Hash)
	if err != nil || subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return nil, refused
	}
	return &rec, nil
}

// Dashboard sessions. A login exchanges a token for a session: a random
// ID the browser keeps in its cookie, never the token itself, so a cookie
// that leaks (a proxy's log, a stolen browser profile) is worth one
// session until it expires, not the token until someone revokes it. The
// store keeps a session under the SHA-256 of its ID, with a TTL of its
// own, so every dashboard of the fleet knows it and it outlives a
// dashboard's restart, and reading the bucket gives no one a cookie.

// DashboardSession is one login under way. Key: DashboardSessionKey of
// its ID.
type DashboardSession struct {
	Version int `json:"version"`
	// Key is the key it is filed under (the hash of its ID).
	Key string `json:"key"`
	// Token is the ID of the dashboard token it was opened with: the
	// session lasts no longer than the token.
	Token     string    `json:"token"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (r *DashboardSession) version() int { return r.Version }

// KeyOK checks the session is filed under its key.
func (r *DashboardSession) KeyOK(key string) error { return keyMust(key, r.Key) }

// DashboardSessionKey is the key a session ID is filed under.
func DashboardSessionKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// PutDashboardSession opens a session for tok lasting ttl and returns its
// ID, for the browser's cookie.
func (s *Store) PutDashboardSession(ctx context.Context, tok *DashboardToken, ttl time.Duration) (string, *DashboardSession, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, err
	}
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	now := time.Now().UTC()
	rec := &DashboardSession{Version: RecordVersion, Key: DashboardSessionKey(id), Token: tok.ID, Name: tok.Name, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	data, err := json.Marshal(rec)
	if err != nil {
		return "", nil, err
	}
	// The key goes a little after the session ends; the record's own
	// expiry is what the check goes by.
	if _, err := s.DashboardSessions.Create(ctx, rec.Key, data, jetstream.KeyTTL(ttl+time.Minute)); err != nil {
		return "", nil, classify(fmt.Errorf("storing a dashboard session: %w", err))
	}
	return id, rec, nil
}

// CheckDashboardSession returns the session id names if it is open: known,
// not expired, and its token not revoked; else an unauthorized error.
func (s *Store) CheckDashboardSession(ctx context.Context, id string) (*DashboardSession, error) {
	refused := Errorf(CodeUnauthorized, "unknown, expired or revoked dashboard session")
	if len(id) < 32 || len(id) > 64 {
		return nil, refused
	}
	var rec DashboardSession
	if _, err := GetJSON(ctx, s.DashboardSessions, DashboardSessionKey(id), &rec); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	if !time.Now().Before(rec.ExpiresAt) {
		return nil, refused
	}
	var tok DashboardToken
	if _, err := GetJSON(ctx, s.DashboardTokens, rec.Token, &tok); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, refused
		}
		return nil, err
	}
	if !tok.CreatedAt.IsZero() && tok.CreatedAt.After(rec.CreatedAt) {
		// A token made after the session is not the one it was opened
		// with.
		return nil, refused
	}
	return &rec, nil
}

// DeleteDashboardSession ends the session id names (a logout); ending one
// that is not there is no error.
func (s *Store) DeleteDashboardSession(ctx context.Context, id string) error {
	if err := s.DashboardSessions.Delete(ctx, DashboardSessionKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("ending a dashboard session: %w", err))
	}
	return nil
}
