package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The dashboard's login tokens and sessions, as stored. The rules (what a
// token looks like, how one is checked, how a session is opened and when
// it holds) are the dashboard's (control/dashboard); the store keeps the
// records, in buckets only the control role reads.

// DashboardToken is one login token as stored: the store keeps only the
// SHA-256 of its secret, so reading the bucket gives no one a login. Key:
// its ID.
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

// PutDashboardToken stores rec; an ID taken already is refused.
func (s *Store) PutDashboardToken(ctx context.Context, rec *DashboardToken) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.dashboardTokens.Create(ctx, rec.ID, data); err != nil {
		return classify(fmt.Errorf("storing dashboard token %s: %w", rec.ID, err))
	}
	return nil
}

// DashboardTokenRecord reads the token stored under id; a missing one is
// a not_found error.
func (s *Store) DashboardTokenRecord(ctx context.Context, id string) (*DashboardToken, error) {
	var rec DashboardToken
	if _, err := GetJSON(ctx, s.dashboardTokens, id, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// ListDashboardTokens lists the stored tokens (never their secrets).
func (s *Store) ListDashboardTokens(ctx context.Context) ([]DashboardToken, error) {
	var out []DashboardToken
	err := ListJSON(ctx, s, s.dashboardTokens, ">", func(_ string, r *DashboardToken) error {
		out = append(out, *r)
		return nil
	})
	return out, err
}

// DeleteDashboardToken revokes the token with id.
func (s *Store) DeleteDashboardToken(ctx context.Context, id string) error {
	if _, err := s.dashboardTokens.Get(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Errorf(CodeNotFound, "no dashboard token %s", id).With("id", id)
		}
		return classify(fmt.Errorf("reading dashboard token %s: %w", id, err))
	}
	if err := s.dashboardTokens.Delete(ctx, id); err != nil {
		return classify(fmt.Errorf("deleting dashboard token %s: %w", id, err))
	}
	return nil
}

// DashboardSession is one login under way, filed under a key the
// dashboard derives from the session's ID (its hash), never the ID the
// browser's cookie holds. Key: Key.
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

// PutDashboardSessionRecord stores a new session under rec.Key, its key
// removed by the store after keyTTL; a key taken already is refused.
func (s *Store) PutDashboardSessionRecord(ctx context.Context, rec *DashboardSession, keyTTL time.Duration) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.dashboardSessions.Create(ctx, rec.Key, data, jetstream.KeyTTL(keyTTL)); err != nil {
		return classify(fmt.Errorf("storing a dashboard session: %w", err))
	}
	return nil
}

// DashboardSessionRecord reads the session stored under key; a missing one
// is a not_found error.
func (s *Store) DashboardSessionRecord(ctx context.Context, key string) (*DashboardSession, error) {
	var rec DashboardSession
	if _, err := GetJSON(ctx, s.dashboardSessions, key, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// DeleteDashboardSessionRecord removes the session stored under key;
// removing one that is not there is no error.
func (s *Store) DeleteDashboardSessionRecord(ctx context.Context, key string) error {
	if err := s.dashboardSessions.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("ending a dashboard session: %w", err))
	}
	return nil
}
