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
