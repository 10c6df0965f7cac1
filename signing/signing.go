// Package signing signs the control plane's intent and checks it where it is
// applied. Deploy commits, routing events, mesh peer records and signer
// certificates carry an ed25519 signature (nkeys) in a message header, over
// the message's subject, its stream sequence, its KV operation and its body.
// Binding the sequence makes a signature good for one place in one stream
// only: a copy of a validly signed message published again, anywhere, does
// not verify, so whoever may write to a stream can neither forge intent nor
// replay old intent over new.
//
// Trust has two levels. The trust root (an operator nkey, O...) lives only on
// storage nodes; it signs signer certificates. Signers (server nkeys, N...)
// sign intent: one per storage node, and any an operator issues for a CLI.
// A retired signer stays valid for what it signed before its retirement,
// stream by stream, and for nothing after it.
package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nkeys"
)

// Header is the message header that carries a signature.
const Header = "Edgeplane-Signature"

// version tags the signed form, so that a later one cannot be confused with
// this one.
const version = "v1"

// Message is what a signature covers: where the message is stored and what
// it says. Op is the KV operation header ("" for a put or a stream message,
// "DEL" for a delete marker), so a signed put cannot pass for a delete.
type Message struct {
	Subject string
	Seq     uint64
	Op      string
	Body    []byte
}

// signed is the byte string the signature covers.
func (m *Message) signed() []byte {
	var b bytes.Buffer
	b.Grow(len(m.Subject) + len(m.Op) + len(m.Body) + 48)
	b.WriteString("edgeplane-signature-" + version + "\n")
	b.WriteString(m.Subject)
	b.WriteByte('\n')
	b.WriteString(strconv.FormatUint(m.Seq, 10))
	b.WriteByte('\n')
	b.WriteString(m.Op)
	b.WriteByte('\n')
	b.Write(m.Body)
	return b.Bytes()
}

// Digest is a hash of what a signature over m covers. A seal (one
// signature over the digests of a batch of messages) vouches for each of
// them as its own signature would: same subject, sequence, operation and
// body.
func (m *Message) Digest() [sha256.Size]byte { return sha256.Sum256(m.signed()) }

// Key is a signing key: a trust root or a signer.
type Key struct {
	kp  nkeys.KeyPair
	pub string
	// priv is kp's ed25519 key, derived once: nkeys derives it from the
	// seed on every signature, which doubles a signature's cost.
	priv ed25519.PrivateKey
}

// NewRoot creates a trust root key.
func NewRoot() (*Key, error) { return newKey(nkeys.CreateOperator) }

// NewSigner creates a signer key.
func NewSigner() (*Key, error) { return newKey(nkeys.CreateServer) }

func newKey(create func() (nkeys.KeyPair, error)) (*Key, error) {
	kp, err := create()
	if err != nil {
		return nil, fmt.Errorf("creating a signing key: %w", err)
	}
	return keyOf(kp)
}

// ParseSeed reads a key from its nkeys seed.
func ParseSeed(seed []byte) (*Key, error) {
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		return nil, fmt.Errorf("not an nkeys seed: %w", err)
	}
	return keyOf(kp)
}

func keyOf(kp nkeys.KeyPair) (*Key, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, err
	}
	if len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("not an ed25519 seed (%d bytes)", len(raw))
	}
	return &Key{kp: kp, pub: pub, priv: ed25519.NewKeyFromSeed(raw)}, nil
}

// PublicKey is the key's public half, what verifiers are told.
func (k *Key) PublicKey() string { return k.pub }

// IsRoot says whether k is a trust root rather than a signer.
func (k *Key) IsRoot() bool { return IsRootKey(k.pub) }

// IsRootKey says whether pub is a trust root's public key.
func IsRootKey(pub string) bool { return nkeys.IsValidPublicOperatorKey(pub) }

// IsSignerKey says whether pub is a signer's public key.
func IsSignerKey(pub string) bool { return nkeys.IsValidPublicServerKey(pub) }

// Sign returns the header value that signs m with k.
func (k *Key) Sign(m Message) string {
	sig := ed25519.Sign(k.priv, m.signed())
	return version + " " + k.pub + " " + strconv.FormatUint(m.Seq, 10) + " " + base64.RawURLEncoding.EncodeToString(sig)
}

// ReadKeyFile reads a key written by WriteKeyFile.
func ReadKeyFile(path string) (*Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading signing key: %w", err)
	}
	k, err := ParseSeed(b)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return k, nil
}

// WriteKeyFile writes k's seed to path, readable by its owner only. The file
// is replaced atomically: a process that reads it meanwhile sees the old key
// or the new one.
func WriteKeyFile(path string, k *Key) error {
	seed, err := k.kp.Seed()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("writing signing key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".signing-key-*")
	if err != nil {
		return fmt.Errorf("writing signing key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(seed, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing signing key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing signing key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing signing key: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing signing key: %w", err)
	}
	return nil
}

// Reasons a signature is refused; Error.Reason holds one.
const (
	ReasonUnsigned     = "unsigned"
	ReasonMalformed    = "malformed"
	ReasonUnknown      = "unknown_signer"
	ReasonReplayed     = "replayed"
	ReasonBadSignature = "bad_signature"
	ReasonRetired      = "retired_signer"
	ReasonNoTrust      = "no_trust_root"
)

// Error is a refused signature.
type Error struct {
	Reason string
	Signer string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refuse(reason, signer, format string, args ...any) *Error {
	return &Error{Reason: reason, Signer: signer, Msg: fmt.Sprintf(format, args...)}
}

// Reason returns err's refusal reason, or "" if err is not a refusal.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// parsed is a signature header taken apart.
type parsed struct {
	signer string
	seq    uint64
	sig    []byte
}

func parse(h string) (*parsed, error) {
	if h == "" {
		return nil, refuse(ReasonUnsigned, "", "no %s header", Header)
	}
	f := strings.Fields(h)
	if len(f) != 4 || f[0] != version {
		return nil, refuse(ReasonMalformed, "", "malformed %s header", Header)
	}
	seq, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		return nil, refuse(ReasonMalformed, f[1], "malformed %s header: sequence %q", Header, f[2])
	}
	sig, err := base64.RawURLEncoding.DecodeString(f[3])
	if err != nil {
		return nil, refuse(ReasonMalformed, f[1], "malformed %s header: %v", Header, err)
	}
	return &parsed{signer: f[1], seq: seq, sig: sig}, nil
}

// SignerOf returns the signer a header names, without checking anything.
func SignerOf(h string) string {
	p, err := parse(h)
	if err != nil {
		return ""
	}
	return p.signer
}

// Bounds says, stream by stream, up to which sequence a retired signer's
// signatures stand. A stream it does not name is one where none do.
type Bounds map[string]uint64

// Trust is what a reader accepts: a root, and the signers the root
// certified. It is safe for concurrent use.
type Trust struct {
	root    string
	rootKP  nkeys.KeyPair
	mu      sync.RWMutex
	signers map[string]*signerEntry
}

type signerEntry struct {
	kp      nkeys.KeyPair
	retired Bounds // nil while active
}

// NewTrust returns a Trust anchored at root, a trust root's public key,
// with no signers yet.
func NewTrust(root string) (*Trust, error) {
	if !IsRootKey(root) {
		return nil, fmt.Errorf("trust root %q is not an operator public key (O...)", root)
	}
	kp, err := nkeys.FromPublicKey(root)
	if err != nil {
		return nil, fmt.Errorf("trust root: %w", err)
	}
	return &Trust{root: root, rootKP: kp, signers: map[string]*signerEntry{}}, nil
}

// Root is the trust root's public key.
func (t *Trust) Root() string { return t.root }

// SetSigner records a signer the root certified; retired nil means active.
func (t *Trust) SetSigner(pub string, retired Bounds) error {
	if !IsSignerKey(pub) {
		return fmt.Errorf("signer %q is not a server public key (N...)", pub)
	}
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.signers[pub] = &signerEntry{kp: kp, retired: retired}
	t.mu.Unlock()
	return nil
}

// Forget drops a signer: its signatures no longer verify.
func (t *Trust) Forget(pub string) {
	t.mu.Lock()
	delete(t.signers, pub)
	t.mu.Unlock()
}

// Signers returns how many signers are known and how many of them are
// retired.
func (t *Trust) Signers() (known, retired int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.signers {
		if e.retired != nil {
			retired++
		}
	}
	return len(t.signers), retired
}

// Knows says whether pub is a known signer.
func (t *Trust) Knows(pub string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.signers[pub] != nil
}

// Verify checks that header signs m, stored in stream, by a signer the root
// certified and that was not retired (in that stream) before m.Seq. It
// returns the signer.
func (t *Trust) Verify(stream string, m Message, header string) (string, error) {
	p, err := parse(header)
	if err != nil {
		return "", err
	}
	t.mu.RLock()
	e := t.signers[p.signer]
	t.mu.RUnlock()
	if e == nil {
		return p.signer, refuse(ReasonUnknown, p.signer, "signed by %s, which the trust root %s did not certify", p.signer, t.root)
	}
	if err := check(e.kp, p, m); err != nil {
		return p.signer, err
	}
	return p.signer, e.standsAt(stream, p.signer, m.Seq)
}

// standsAt refuses a retired signer's signature past its bound in stream.
func (e *signerEntry) standsAt(stream, signer string, seq uint64) error {
	if e.retired != nil {
		if last, ok := e.retired[stream]; !ok || seq > last {
			return refuse(ReasonRetired, signer, "signed by %s, retired before sequence %d of %s", signer, seq, stream)
		}
	}
	return nil
}

// Vouches checks that signer, whose signature at some earlier sequence of
// stream verified, still stood at seq: a seal a signer made before its
// retirement vouches for nothing stored after it.
func (t *Trust) Vouches(stream, signer string, seq uint64) error {
	t.mu.RLock()
	e := t.signers[signer]
	t.mu.RUnlock()
	if e == nil {
		return refuse(ReasonUnknown, signer, "signed by %s, which the trust root %s did not certify", signer, t.root)
	}
	return e.standsAt(stream, signer, seq)
}

// VerifyRoot checks that header signs m by the trust root itself.
func (t *Trust) VerifyRoot(m Message, header string) error {
	p, err := parse(header)
	if err != nil {
		return err
	}
	if p.signer != t.root {
		return refuse(ReasonUnknown, p.signer, "signed by %s, not by the trust root %s", p.signer, t.root)
	}
	return check(t.rootKP, p, m)
}

func check(kp nkeys.KeyPair, p *parsed, m Message) error {
	if p.seq != m.Seq {
		return refuse(ReasonReplayed, p.signer, "signed for sequence %d, stored at %d: a copy of another message", p.seq, m.Seq)
	}
	if err := kp.Verify(m.signed(), p.sig); err != nil {
		return refuse(ReasonBadSignature, p.signer, "signature by %s does not match the message", p.signer)
	}
	return nil
}

// Seed is the key's nkeys seed: what a key file holds.
func (k *Key) Seed() ([]byte, error) { return k.kp.Seed() }
