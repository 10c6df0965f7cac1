package store

import (
	"fmt"
	"os"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// InboxPrefix is the reply-subject prefix a user may subscribe to: every
// client connecting with credentials uses it, so one role cannot read the
// replies (certificate values, say) meant for another.
func InboxPrefix(userPub string) string { return "_INBOX." + userPub }

// credsOptions are the connect options for a credentials file: the user
// JWT and seed, and the user's own inbox prefix.
func credsOptions(file string) ([]nats.Option, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading credentials %s: %w", file, err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: not a user JWT: %w", file, err)
	}
	return []nats.Option{nats.UserCredentials(file), nats.CustomInboxPrefix(InboxPrefix(uc.Subject))}, nil
}
