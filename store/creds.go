package store

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

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
// JWT and seed, and the user's own inbox prefix, from a holder that reads
// the file again at every connect. A renewal (RenewCreds, in this process
// or another sharing the file) replaces the file with credentials of the
// same line, which keep the inbox prefix (InboxKeyOf): the next reconnect
// takes them. Credentials of another line (issued anew) would be refused
// the connection's inbox: they take effect at the process's next start,
// never at a reconnect.
func credsOptions(file string) ([]nats.Option, *credsHolder, error) {
	c, err := readCreds(file)
	if err != nil {
		return nil, nil, err
	}
	h := &credsHolder{file: file, cur: c}
	return []nats.Option{nats.UserJWT(h.userJWT, h.sign), nats.CustomInboxPrefix(InboxPrefix(c.inbox))}, h, nil
}

// heldCreds is one credentials file's content.
type heldCreds struct {
	jwt   string
	kp    nkeys.KeyPair
	pub   string
	inbox string
	role  string
	// machine is the machine (or gateway name) the credentials name.
	machine  string
	issued   time.Time
	expires  time.Time
	contents []byte
}

func readCreds(file string) (*heldCreds, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading credentials %s: %w", file, err)
	}
	return parseCreds(file, b)
}

// reread is the credentials in file now: held itself while the file's
// contents are the ones held was read from. Decoding a user JWT verifies
// its signature; a box reconnecting (every box, when a storage node
// restarts) reads an unchanged file, and decodes nothing.
func (held *heldCreds) reread(file string) (*heldCreds, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading credentials %s: %w", file, err)
	}
	if bytes.Equal(b, held.contents) {
		return held, nil
	}
	return parseCreds(file, b)
}

func parseCreds(file string, b []byte) (*heldCreds, error) {
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
	if _, err := kp.Seed(); err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	pub, _ := kp.PublicKey()
	if pub != uc.Subject {
		return nil, fmt.Errorf("credentials %s: the JWT is for %s, the seed is %s's", file, uc.Subject, pub)
	}
	who, _ := userOfClaims(uc)
	c := &heldCreds{jwt: tok, kp: kp, pub: pub, inbox: InboxKeyOf(uc), role: who.Role, machine: who.Machine,
		issued: time.Unix(uc.IssuedAt, 0), contents: b}
	if uc.Expires > 0 {
		c.expires = time.Unix(uc.Expires, 0)
	}
	return c, nil
}

// expiredError is what a box whose credentials expired is told: what
// expired, when, and what to do.
func (c *heldCreds) expiredError(file string) *Error {
	who := c.role
	if c.machine != "" {
		who += " of machine " + c.machine
	}
	e := Errorf(CodeUnauthorized, "the credentials in %s (%s) expired at %s: a box offline past its credentials' lifetime must be invited again "+
		"(on the control plane: `control machine rm %s` and `control machine invite`; on this box: `control agent --join TOKEN` with a fresh data dir), "+
		"or be given new credentials (`control creds issue`) in %s and restarted",
		file, who, c.expires.UTC().Format(time.RFC3339), cmpOr(c.machine, "MACHINE"), file).
		With("creds", file).With("expired_at", c.expires.UTC().Format(time.RFC3339))
	if c.machine != "" {
		e = e.With("machine", c.machine)
	}
	return e
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// credsHolder hands a connection its credentials at every connect.
type credsHolder struct {
	file string
	// opts are the options the connection was made with, for a bridge
	// while it switches keys (switchTo).
	opts ConnectOptions

	mu  sync.Mutex
	cur *heldCreds
	// used is the key the last connect attempt presented.
	used string
	// expired is set while the credentials held are expired: no connect
	// is attempted with them.
	expired *Error
}

// userJWT is the connection's JWT callback: the file's credentials if they
// are of the connection's line (a renewal), else those it holds; never
// expired ones, which the server would refuse after a round trip, at every
// reconnect, forever.
func (h *credsHolder) userJWT() (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, err := h.cur.reread(h.file); err == nil && c.inbox == h.cur.inbox && c.pub != h.cur.pub && !c.issued.Before(h.cur.issued) {
		h.cur = c
	}
	if !h.cur.expires.IsZero() && !time.Now().Before(h.cur.expires) {
		h.expired = h.cur.expiredError(h.file)
		return "", h.expired
	}
	h.expired, h.used = nil, h.cur.pub
	return h.cur.jwt, nil
}

func (h *credsHolder) sign(nonce []byte) ([]byte, error) {
	h.mu.Lock()
	kp := h.cur.kp
	h.mu.Unlock()
	return kp.Sign(nonce)
}

// current is the credentials the holder presents, and the key of the last
// connect attempt.
func (h *credsHolder) current() (*heldCreds, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.used
}

func (h *credsHolder) expiredErr() *Error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.expired
}

// holders are the credentials of each open connection, for RenewCreds.
var holders sync.Map // *nats.Conn -> *credsHolder

// edge reports whether the credentials held are of an untrusted role
// (a user of the edge account, see EdgeAPIPrefix).
func (h *credsHolder) edge() bool {
	cur, _ := h.current()
	return cur.role != "" && cur.role != "control"
}

func holderOf(nc *nats.Conn) *credsHolder {
	if v, ok := holders.Load(nc); ok {
		return v.(*credsHolder)
	}
	return nil
}
