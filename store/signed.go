package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/edgeplane/edgeplane/signing"
)

// Signed intent. Deploy commits, routing events, mesh peer records and the
// signer certificates themselves are appended with a signature that binds
// their stream sequence (package signing): each append expects the stream's
// last sequence, so the sequence signed is the one the message gets. Every
// reader that acts on them verifies the signature first, under the trust
// root its configuration, its credentials or its first contact named.

// Signer provides the key intent is signed with; it may change between
// calls (a rotated key file).
type Signer interface {
	SigningKey() (*signing.Key, error)
}

// StaticSigner is a Signer of one key.
type StaticSigner struct{ Key *signing.Key }

// SigningKey returns the key.
func (s StaticSigner) SigningKey() (*signing.Key, error) { return s.Key, nil }

// Trust sources, as status reports them.
const (
	// TrustFromConfig: the part's configuration names the root.
	TrustFromConfig = "config"
	// TrustFromCreds: the credentials file carries it (control creds issue).
	TrustFromCreds = "credentials"
	// TrustFromPin: a root learned earlier and pinned to local disk.
	TrustFromPin = "pinned"
	// TrustFromFirstUse: read from the store on first contact and trusted
	// from then on (no credentials, no configured root).
	TrustFromFirstUse = "first use"
	// TrustFromRootKey: this process holds the root itself.
	TrustFromRootKey = "root key"
)

// Anchor is where a reader's trust starts: the root's public key, how it was
// learned, and where a root learned on first use is pinned.
type Anchor struct {
	Root   string
	Source string
	// PinFile, when set, keeps a root learned on first use (and is read
	// before asking the store).
	PinFile string
}

// ResolveAnchor says where a reader's trust starts: root when set (the
// part's configuration), else the root its credentials file carries, else
// the one pinned in pinFile, or learned from the store on first use and
// pinned there ("" pins nothing).
func ResolveAnchor(root, credsFile, pinFile string) (Anchor, error) {
	if root != "" {
		return Anchor{Root: root, Source: TrustFromConfig, PinFile: pinFile}, nil
	}
	if credsFile != "" {
		r, err := CredsTrustRoot(credsFile)
		if err != nil {
			return Anchor{}, &Error{Code: CodeInvalid, Message: err.Error(), Detail: map[string]string{"creds": credsFile}}
		}
		if r != "" {
			return Anchor{Root: r, Source: TrustFromCreds, PinFile: pinFile}, nil
		}
	}
	return Anchor{PinFile: pinFile}, nil
}

// trustState is the Trust a Store verifies with, made when first needed.
type trustState struct {
	mu     sync.Mutex
	anchor Anchor
	trust  *signing.Trust
}

// SignWith makes s sign what it appends with sig. Call it before s is used.
func (s *Store) SignWith(sig Signer) { s.signer = sig }

// Signing says whether s has a signer.
func (s *Store) Signing() bool { return s.signer != nil }

// TrustAnchor sets where s's trust starts. Call it before s is used.
func (s *Store) TrustAnchor(a Anchor) {
	s.trust.mu.Lock()
	s.trust.anchor, s.trust.trust = a, nil
	s.trust.mu.Unlock()
}

// TrustWith makes s verify with t. Call it before s is used.
func (s *Store) TrustWith(t *signing.Trust, source string) {
	s.trust.mu.Lock()
	s.trust.anchor, s.trust.trust = Anchor{Root: t.Root(), Source: source}, t
	s.trust.mu.Unlock()
}

// KnownTrust returns the Trust s verifies with and its anchor, without
// learning anything: nil before the root is known.
func (s *Store) KnownTrust() (*signing.Trust, Anchor) {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	return s.trust.trust, s.trust.anchor
}

// Trust returns the Trust s verifies with, learning the root on first use
// when no anchor names it.
func (s *Store) Trust(ctx context.Context) (*signing.Trust, Anchor, error) {
	s.trust.mu.Lock()
	defer s.trust.mu.Unlock()
	if s.trust.trust != nil {
		return s.trust.trust, s.trust.anchor, nil
	}
	a := s.trust.anchor
	if a.Root == "" && a.PinFile != "" {
		if b, err := os.ReadFile(a.PinFile); err == nil {
			a.Root, a.Source = strings.TrimSpace(string(b)), TrustFromPin
		}
	}
	if a.Root == "" {
		root, err := s.ReadTrustRoot(ctx)
		if err != nil {
			return nil, a, err
		}
		a.Root, a.Source = root, TrustFromFirstUse
		if a.PinFile != "" {
			if err := pinRoot(a.PinFile, root); err != nil {
				return nil, a, err
			}
		}
	}
	t, err := signing.NewTrust(a.Root)
	if err != nil {
		return nil, a, &Error{Code: CodeInvalid, Message: fmt.Sprintf("trust root from %s: %v", a.Source, err)}
	}
	s.trust.anchor, s.trust.trust = a, t
	return t, a, nil
}

func pinRoot(file, root string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("pinning the trust root: %w", err)
	}
	if err := os.WriteFile(file, []byte(root+"\n"), 0o600); err != nil {
		return fmt.Errorf("pinning the trust root: %w", err)
	}
	return nil
}

// CredsTrustRoot returns the trust root a credentials file carries (a tag
// of its user JWT that `control creds issue` adds), or "".
func CredsTrustRoot(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading credentials %s: %w", file, err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("credentials %s: not a user JWT: %w", file, err)
	}
	for _, tag := range uc.Tags {
		if v, ok := strings.CutPrefix(tag, TrustRootTag); ok {
			// JWT tags are lower-cased; nkeys are upper-case base32.
			return strings.ToUpper(v), nil
		}
	}
	return "", nil
}

// TrustRootTag prefixes the user JWT tag that carries the trust root.
const TrustRootTag = "trust-root:"

// Signer records. Key SignerKey(pub) holds a signer's certificate, signed by
// the trust root; key TrustRootKey holds the root's own public key, signed
// by itself, for readers that learn it on first use.

// SignerRecord certifies a signer. Retired, once set, says up to which
// sequence of each stream the signer's signatures stand.
type SignerRecord struct {
	Version  int       `json:"version"`
	Key      string    `json:"key"`
	Name     string    `json:"name"`
	IssuedAt time.Time `json:"issued_at"`
	// Retired maps a stream to the last sequence the signer's signatures
	// cover in it; nil while the signer is active.
	Retired   signing.Bounds `json:"retired,omitempty"`
	RetiredAt *time.Time     `json:"retired_at,omitempty"`
}

func (r *SignerRecord) version() int { return r.Version }

// TrustRootRecord names the trust root.
type TrustRootRecord struct {
	Version   int       `json:"version"`
	Key       string    `json:"key"`
	CreatedAt time.Time `json:"created_at"`
}

func (r *TrustRootRecord) version() int { return r.Version }

// SignerKey is the signers bucket key of signer pub.
func SignerKey(pub string) string { return "signer." + pub }

// TrustRootKey is the signers bucket key of the trust root.
const TrustRootKey = "root"

// SigningStreams are the streams signed intent lives in: what a retirement
// bounds.
func (n Names) SigningStreams() []string {
	return []string{n.DeployCommitsStream(), n.RoutingEventsStream(), "KV_" + n.MeshPeersBucket(), "KV_" + n.SignersBucket()}
}

// appendSigned appends body to subject, in stream, signed by key with the
// sequence it gets. op is the KV operation ("" or "DEL"), msgID makes a
// retry idempotent (one is made up when empty), and extra adds expectations (a KV create's "no such
// key yet"). Racing appenders retry with the sequence that beat them.
func (s *Store) appendSigned(ctx context.Context, key func() (*signing.Key, error), stream, subject, op string, body []byte, msgID string, extra ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if key == nil {
		return nil, errSigningKeyRequired()
	}
	last, err := s.lastSeq(ctx, stream)
	if err != nil {
		return nil, err
	}
	// Every append carries a message ID: an attempt whose acknowledgement
	// was lost in a leader election is retried with it, and the stream
	// answers a copy that already landed as a duplicate instead of storing
	// it twice.
	if msgID == "" {
		msgID = nuid.Next()
	}
	const maxAttempts = 100
	for attempt := 1; ; attempt++ {
		k, err := key()
		if err != nil {
			return nil, &Error{Code: CodeSigningKeyRequired, Message: err.Error()}
		}
		m := nats.NewMsg(s.putPrefix(subject) + subject)
		m.Data = body
		if op != "" {
			m.Header.Set(kvOperationHeader, op)
		}
		m.Header.Set(signing.Header, k.Sign(signing.Message{Subject: subject, Seq: last + 1, Op: op, Body: body}))
		opts := append([]jetstream.PublishOpt{jetstream.WithExpectLastSequence(last), jetstream.WithMsgID(msgID)}, extra...)
		var ack *jetstream.PubAck
		err = s.ride(ctx, "append to "+subject, func(ctx context.Context, _ bool) (err error) {
			ack, err = s.JS.PublishMsg(ctx, m, opts...)
			return err
		})
		if err == nil {
			if !ack.Duplicate {
				s.noteLastSeq(stream, ack.Sequence)
			}
			return ack, nil
		}
		if !IsWrongLastSequence(err) || attempt == maxAttempts || ctx.Err() != nil {
			return nil, err
		}
		// Someone appended first, or (with extra expectations) the
		// subject's own check failed: the stream's head tells which.
		cur, ok := wrongSeqOf(err)
		if !ok || len(extra) > 0 {
			s.forgetLastSeq(stream)
			if cur, err = s.lastSeq(ctx, stream); err != nil {
				return nil, err
			}
			if cur == last {
				return nil, errSubjectExpectation
			}
		}
		last = cur
	}
}

func errSigningKeyRequired() *Error {
	return &Error{Code: CodeSigningKeyRequired, Message: "writing intent needs a signing key: pass --signing-key FILE (control server writes DATA/signer.nk; `control signing issue` makes more)"}
}

// AppendSigned appends body to subject of stream, signed by s's signer,
// and returns its sequence: intent with no method of its own.
func (s *Store) AppendSigned(ctx context.Context, stream, subject string, body []byte) (uint64, error) {
	ack, err := s.appendSigned(ctx, s.signerKey(), stream, subject, "", body, "")
	if err != nil {
		return 0, classify(fmt.Errorf("appending to %s: %w", subject, err))
	}
	return ack.Sequence, nil
}

// errSubjectExpectation is an append refused by its subject's expectation
// (a KV create of a key that exists), not by a racing appender.
var errSubjectExpectation = errors.New("the key already exists or changed")

// kvOperationHeader marks a KV delete marker.
const kvOperationHeader = "KV-Operation"

// putPrefix is what goes before a stored subject when publishing it on this
// connection: the API prefix for KV subjects, as nats.go's KV does.
func (s *Store) putPrefix(subject string) string {
	if strings.HasPrefix(subject, "$KV.") {
		return kvPutPrefix(s.JS)
	}
	return ""
}

// wrongSeqOf reads the current sequence out of a "wrong last sequence: N"
// refusal.
func wrongSeqOf(err error) (uint64, bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return 0, false
	}
	_, n, ok := strings.Cut(apiErr.Description, "wrong last sequence: ")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64)
	return v, err == nil
}

func (s *Store) lastSeq(ctx context.Context, stream string) (uint64, error) {
	s.heads.mu.Lock()
	v, ok := s.heads.last[stream]
	s.heads.mu.Unlock()
	if ok {
		return v, nil
	}
	str, err := s.JS.Stream(ctx, stream)
	if err != nil {
		return 0, classify(fmt.Errorf("reading %s: %w", stream, err))
	}
	v = str.CachedInfo().State.LastSeq
	s.noteLastSeq(stream, v)
	return v, nil
}

func (s *Store) noteLastSeq(stream string, seq uint64) {
	s.heads.mu.Lock()
	if s.heads.last == nil {
		s.heads.last = map[string]uint64{}
	}
	if seq > s.heads.last[stream] {
		s.heads.last[stream] = seq
	}
	s.heads.mu.Unlock()
}

func (s *Store) forgetLastSeq(stream string) {
	s.heads.mu.Lock()
	delete(s.heads.last, stream)
	s.heads.mu.Unlock()
}

// signerKey is s's signer as appendSigned takes it.
func (s *Store) signerKey() func() (*signing.Key, error) {
	if s.signer == nil {
		return nil
	}
	return s.signer.SigningKey
}

// Verify checks m, read from stream, against s's trust. A signer s does not
// know yet is looked up (its certificate, verified by the root) before m is
// refused. The error is a *signing.Error for a refused signature.
func (s *Store) Verify(ctx context.Context, stream string, m *StoredMsg) error {
	t, _, err := s.Trust(ctx)
	if err != nil {
		return err
	}
	msg := signing.Message{Subject: m.Subject, Seq: m.Seq, Op: m.Header.Get(kvOperationHeader), Body: m.Data}
	h := m.Header.Get(signing.Header)
	signer, err := t.Verify(stream, msg, h)
	if signing.Reason(err) == signing.ReasonUnknown && signer != "" {
		if lerr := s.LoadSigner(ctx, signer); lerr != nil {
			var se *signing.Error
			if !errors.As(lerr, &se) && !HasCode(lerr, CodeNotFound) {
				return lerr // could not ask: not a verdict
			}
			return err
		}
		_, err = t.Verify(stream, msg, h)
	}
	return err
}

// LoadSigner reads signer pub's certificate and, if the trust root signed
// it, adds it to s's trust.
func (s *Store) LoadSigner(ctx context.Context, pub string) error {
	if !signing.IsSignerKey(pub) {
		return &signing.Error{Reason: signing.ReasonUnknown, Signer: pub, Msg: fmt.Sprintf("%q is not a signer key", pub)}
	}
	var found *StoredMsg
	err := s.LastOf(ctx, "KV_"+s.Names.SignersBucket(), []string{s.signersSubject(SignerKey(pub))}, func(m *StoredMsg) error {
		found = m
		return nil
	})
	if err != nil {
		return err
	}
	if found == nil {
		return &Error{Code: CodeNotFound, Message: fmt.Sprintf("no certificate for signer %s", pub)}
	}
	return s.ApplySignerMsg(ctx, found)
}

// LoadSigners reads every signer certificate into s's trust: what a reader
// does before verifying a batch, and again after it may have missed
// updates. It returns what it could not use, each skipped.
func (s *Store) LoadSigners(ctx context.Context) (skipped []error, err error) {
	if _, _, err := s.Trust(ctx); err != nil {
		return nil, err
	}
	prefix := s.signersSubject("signer.")
	latest := map[string]*StoredMsg{}
	_, err = s.ReadFrom(ctx, "KV_"+s.Names.SignersBucket(), 1, prefix+">", func(m *StoredMsg) error {
		latest[m.Subject] = m
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading signers: %w", err)
	}
	for _, m := range latest {
		if err := s.ApplySignerMsg(ctx, m); err != nil {
			skipped = append(skipped, err)
		}
	}
	return skipped, nil
}

// ApplySignerMsg applies one stored message of the signers bucket (read, or
// as republished): a certificate the root signed sets the signer, a deleted
// or unverifiable one makes it unknown. It returns why it refused m.
func (s *Store) ApplySignerMsg(ctx context.Context, m *StoredMsg) error {
	t, _, err := s.Trust(ctx)
	if err != nil {
		return err
	}
	key := strings.TrimPrefix(m.Subject, s.signersSubject(""))
	pub, ok := strings.CutPrefix(key, "signer.")
	if !ok {
		return nil // the root record, or another key
	}
	op := m.Header.Get(kvOperationHeader)
	if err := t.VerifyRoot(signing.Message{Subject: m.Subject, Seq: m.Seq, Op: op, Body: m.Data}, m.Header.Get(signing.Header)); err != nil {
		t.Forget(pub)
		return fmt.Errorf("signer certificate %s: %w", pub, err)
	}
	if op != "" {
		t.Forget(pub)
		return nil
	}
	var rec SignerRecord
	if err := DecodeKeyed(s.Names.SignersBucket(), key, m.Data, &rec); err != nil {
		t.Forget(pub)
		return err
	}
	if err := t.SetSigner(pub, rec.Retired); err != nil {
		t.Forget(pub)
		return fmt.Errorf("signer certificate %s: %w", pub, err)
	}
	return nil
}

func (s *Store) signersSubject(key string) string {
	return "$KV." + s.Names.SignersBucket() + "." + key
}

// ReadTrustRoot returns the trust root the store names (its root record,
// signed by itself): what a reader with no configured root trusts on first
// use.
func (s *Store) ReadTrustRoot(ctx context.Context) (string, error) {
	var found *StoredMsg
	err := s.LastOf(ctx, "KV_"+s.Names.SignersBucket(), []string{s.signersSubject(TrustRootKey)}, func(m *StoredMsg) error {
		found = m
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == nil {
		return "", &Error{Code: CodeNotFound, Message: "the store names no trust root yet: has a `control server` started on it?"}
	}
	var rec TrustRootRecord
	if err := DecodeKeyed(s.Names.SignersBucket(), TrustRootKey, found.Data, &rec); err != nil {
		return "", err
	}
	t, err := signing.NewTrust(rec.Key)
	if err != nil {
		return "", &Error{Code: CodeInvalid, Message: err.Error()}
	}
	if err := t.VerifyRoot(signing.Message{Subject: found.Subject, Seq: found.Seq, Body: found.Data}, found.Header.Get(signing.Header)); err != nil {
		return "", &Error{Code: CodeBadSignature, Message: fmt.Sprintf("the store's trust root record: %v", err)}
	}
	return rec.Key, nil
}

// PublishTrustRoot records root as the store's trust root, once: a store
// that names another root refuses with a conflict.
func (s *Store) PublishTrustRoot(ctx context.Context, root *signing.Key) error {
	if cur, err := s.ReadTrustRoot(ctx); err == nil {
		if cur != root.PublicKey() {
			return &Error{Code: CodeConflict, Message: fmt.Sprintf("the store's intent is signed under trust root %s; this server's root is %s (copy the auth dir of a storage node of this store)", cur, root.PublicKey()),
				Detail: map[string]string{"store_root": cur, "root": root.PublicKey()}}
		}
		return nil
	} else if !HasCode(err, CodeNotFound) {
		return err
	}
	rec := TrustRootRecord{Version: RecordVersion, Key: root.PublicKey(), CreatedAt: time.Now().UTC()}
	data, err := json.Marshal(&rec)
	if err != nil {
		return err
	}
	_, err = s.appendSigned(ctx, keyOf(root), "KV_"+s.Names.SignersBucket(), s.signersSubject(TrustRootKey), "", data, "",
		jetstream.WithExpectLastSequencePerSubject(0))
	if errors.Is(err, errSubjectExpectation) {
		return s.PublishTrustRoot(ctx, root) // a racing server wrote it: compare
	}
	if err != nil {
		return classify(fmt.Errorf("recording the trust root: %w", err))
	}
	return nil
}

func keyOf(k *signing.Key) func() (*signing.Key, error) {
	return func() (*signing.Key, error) { return k, nil }
}

// PutSignerRecord stores rec, a signer's certificate, signed by root under
// the signer's key. What a certificate may say (a server key, retirement
// bounds) is the trust root's owner's to decide: store/signers.
func (s *Store) PutSignerRecord(ctx context.Context, root *signing.Key, rec SignerRecord) error {
	rec.Version = RecordVersion
	data, err := json.Marshal(&rec)
	if err != nil {
		return err
	}
	if _, err := s.appendSigned(ctx, keyOf(root), "KV_"+s.Names.SignersBucket(), s.signersSubject(SignerKey(rec.Key)), "", data, ""); err != nil {
		return classify(fmt.Errorf("certifying signer %s: %w", rec.Key, err))
	}
	return nil
}

// ListSigners returns every signer certificate, verified against s's trust;
// a certificate the root did not sign is returned in bad.
func (s *Store) ListSigners(ctx context.Context) (good []SignerRecord, bad []error, err error) {
	t, _, err := s.Trust(ctx)
	if err != nil {
		return nil, nil, err
	}
	prefix := s.signersSubject("signer.")
	latest := map[string]*StoredMsg{}
	if _, err := s.ReadFrom(ctx, "KV_"+s.Names.SignersBucket(), 1, prefix+">", func(m *StoredMsg) error {
		latest[m.Subject] = m
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("listing signers: %w", err)
	}
	for subj, m := range latest {
		op := m.Header.Get(kvOperationHeader)
		if err := t.VerifyRoot(signing.Message{Subject: subj, Seq: m.Seq, Op: op, Body: m.Data}, m.Header.Get(signing.Header)); err != nil {
			bad = append(bad, fmt.Errorf("%s: %w", strings.TrimPrefix(subj, prefix), err))
			continue
		}
		if op != "" {
			continue
		}
		var rec SignerRecord
		if err := DecodeKeyed(s.Names.SignersBucket(), strings.TrimPrefix(subj, s.signersSubject("")), m.Data, &rec); err != nil {
			bad = append(bad, err)
			continue
		}
		good = append(good, rec)
	}
	return good, bad, nil
}
