package store

import (
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// InboxPrefix is the reply-subject prefix a user may subscribe to: every
// client connecting with credentials uses it, so one role cannot read the
// replies (certificate values, say) meant for another.
func InboxPrefix(userPub string) string { return "_INBOX." + userPub }

// InboxKeyOf is the key whose inbox uc may answer on: the one its
// permissions name (a renewed credential keeps the inbox of the first key
// of its line, so a process that switches to it keeps its reply
// subscriptions), else its own.
func InboxKeyOf(uc *jwt.UserClaims) string {
	for _, s := range uc.Permissions.Sub.Allow {
		if k, ok := strings.CutPrefix(s, "_INBOX."); ok {
			if k, ok := strings.CutSuffix(k, ".>"); ok && nkeys.IsValidPublicUserKey(k) {
				return k
			}
		}
	}
	return uc.Subject
}

// credsOptions are the connect options for a credentials file: the user
// JWT and seed, read once, and the user's own inbox prefix. Reading the file
// once keeps the identity and the inbox prefix together for the life of the
// connection: a file replaced under a running process (credentials issued
// anew) takes effect at its next start, never at a reconnect, where a new
// user would be refused the old user's inbox.
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
	kp, err := jwt.ParseDecoratedUserNKey(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	return []nats.Option{nats.UserJWTAndSeed(tok, string(seed)), nats.CustomInboxPrefix(InboxPrefix(InboxKeyOf(uc)))}, nil
}
