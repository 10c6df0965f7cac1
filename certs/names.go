package certs

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"

	"github.com/edgeplane/edgeplane/store"
)

// ErrInvalidKey is wrapped by every error about a storage key that cannot be
// stored (empty, empty path segment, too long).
var ErrInvalidKey = errors.New("invalid storage key")

// maxEncodedKey bounds an encoded key. A KV put travels as a subject on the
// protocol's control line (4 KiB by default, shared with the bucket prefix and
// the reply subject), so anything longer would fail deep inside NATS with an
// unhelpful message.
const maxEncodedKey = 3000

// hostProfile maps and validates a hostname the way a resolver would (UTS 46
// lookup mapping, which also lower-cases), but accepts underscores, which
// certmagic names and real DNS labels such as _acme-challenge may carry.
var hostProfile = idna.New(
	idna.MapForLookup(),
	idna.Transitional(false),
	idna.BidiRule(),
	idna.StrictDomainName(false),
)

// NormalizeHost returns the one spelling of a certificate subject that names
// its lock and its storage keys: lower case, no trailing dot, IDNA A-labels,
// a leading "*." kept for wildcards. IP addresses come back in their canonical
// form. Names that are not hostnames (e-mail addresses, URIs) are only trimmed
// and lower-cased.
func NormalizeHost(name string) (string, error) {
	h := strings.TrimSpace(name)
	if h == "" {
		return "", fmt.Errorf("normalizing host: empty name")
	}
	if strings.ContainsAny(h, "@/") {
		return strings.ToLower(h), nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return ip.String(), nil
	}
	h = strings.TrimSuffix(h, ".")
	wildcard := false
	if strings.HasPrefix(h, "*.") {
		wildcard, h = true, h[2:]
	}
	if h == "" || strings.HasSuffix(h, ".") || strings.HasPrefix(h, ".") || strings.Contains(h, "..") {
		return "", fmt.Errorf("normalizing host %q: empty label", name)
	}
	a, err := hostProfile.ToASCII(h)
	if err != nil {
		return "", fmt.Errorf("normalizing host %q: %w", name, err)
	}
	a = strings.ToLower(a)
	if len(a) > 253 {
		return "", fmt.Errorf("normalizing host %q: %d bytes is longer than a DNS name may be (253)", name, len(a))
	}
	if wildcard {
		a = "*." + a
	}
	return a, nil
}

// normalizeOrLower is NormalizeHost for places that must produce a name even
// for garbage input (a lock name certmagic made up): the input lower-cased.
func normalizeOrLower(name string) string {
	if h, err := NormalizeHost(name); err == nil {
		return h
	}
	return strings.ToLower(strings.TrimSpace(name))
}

// certmagic's lock-name prefixes (certmagic v0.25.6: config.go lockKey with
// certIssueLockOp, account.go accountRegLockKey). Both obtain and renew use
// issue_cert_<name>.
const (
	certmagicIssuePrefix   = "issue_cert_"
	certmagicAccountPrefix = "register_acme_account"
)

// LockKey maps a lock name certmagic passes to Lock/TryLock/Unlock to a key
// in the store's locks bucket:
//
//   - "issue_cert_<name>" (obtain and renew) -> store.CertLockKey of the
//     normalised name, so every spelling of a host shares one lock;
//   - "register_acme_account[_<contact>]" -> store.AcmeAccountLockKey. certmagic
//     names the account lock after the primary contact only, not the CA, so
//     registrations of one contact with two CAs are serialised: harmless;
//   - anything else (ari_<id>, storage_clean, Caddy's ECH locks) ->
//     "cp.lock.certmagic.<encoded name>".
func LockKey(name string) string {
	switch {
	case strings.HasPrefix(name, certmagicIssuePrefix):
		return store.CertLockKey(normalizeOrLower(strings.TrimPrefix(name, certmagicIssuePrefix)))
	case name == certmagicAccountPrefix:
		return store.AcmeAccountLockKey("default")
	case strings.HasPrefix(name, certmagicAccountPrefix+"_"):
		return store.AcmeAccountLockKey(strings.ToLower(strings.TrimPrefix(name, certmagicAccountPrefix+"_")))
	}
	if name == "" {
		return "cp.lock.certmagic._"
	}
	return "cp.lock.certmagic." + store.KeySafe(name)
}

// EncodeKey turns a certmagic storage key ("a/b/c.crt") into a KV key. Each
// "/"-separated segment becomes one subject token, so a directory is a
// subject prefix and List can filter on "<dir>.>" instead of scanning the
// bucket. Inside a segment letters, digits and '-' stay, '.' becomes '=' and
// every other byte becomes "_xx" (lower-case hex); DecodeKey reverses it.
//
// Keys of certificate resources and challenge tokens are canonicalised first
// (see CanonicalKey), so two spellings of one host meet at one key.
func EncodeKey(key string) (string, error) {
	segs, err := splitKey(key)
	if err != nil {
		return "", err
	}
	segs = canonicalSegments(segs)
	var b strings.Builder
	for i, s := range segs {
		if i > 0 {
			b.WriteByte('.')
		}
		encodeSegment(&b, s)
	}
	if b.Len() > maxEncodedKey {
		return "", fmt.Errorf("%w: %q encodes to %d bytes, more than the %d a NATS KV key may carry here",
			ErrInvalidKey, truncate(key, 80), b.Len(), maxEncodedKey)
	}
	return b.String(), nil
}

// encodePrefix is EncodeKey for a List/Exists prefix: "" is the root.
func encodePrefix(prefix string) (string, error) {
	if prefix == "" {
		return "", nil
	}
	return EncodeKey(prefix)
}

// CanonicalKey is the key as it will be stored and listed.
func CanonicalKey(key string) (string, error) {
	segs, err := splitKey(key)
	if err != nil {
		return "", err
	}
	return strings.Join(canonicalSegments(segs), "/"), nil
}

func splitKey(key string) ([]string, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	segs := strings.Split(key, "/")
	for i, s := range segs {
		if s == "" {
			return nil, fmt.Errorf("%w: %q has an empty path segment at %d (leading, trailing or double '/')",
				ErrInvalidKey, truncate(key, 80), i)
		}
	}
	return segs, nil
}

// canonicalSegments removes trailing dots from the host in certmagic's
// per-site keys, which certmagic builds from the name as given:
// certificates/<issuer>/<host>/<host>.{crt,key,json} and
// acme/<ca>/challenge_tokens/<host>.json. certmagic already lower-cases them
// (KeyBuilder.Safe), and IDNA hosts reach storage in A-label form.
func canonicalSegments(segs []string) []string {
	if len(segs) >= 3 && segs[0] == "certificates" {
		site := segs[2]
		trimmed := strings.TrimRight(site, ".")
		if trimmed != site && trimmed != "" {
			segs = append([]string(nil), segs...)
			segs[2] = trimmed
			if len(segs) >= 4 && strings.HasPrefix(segs[3], site) {
				segs[3] = trimmed + segs[3][len(site):]
			}
		}
	}
	if len(segs) == 4 && segs[0] == "acme" && segs[2] == "challenge_tokens" {
		f := segs[3]
		if base, ok := strings.CutSuffix(f, ".json"); ok {
			if t := strings.TrimRight(base, "."); t != base && t != "" {
				segs = append([]string(nil), segs...)
				segs[3] = t + ".json"
			}
		}
	}
	return segs
}

func encodeSegment(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		case c == '.':
			b.WriteByte('=')
		default:
			b.WriteByte('_')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
}

// DecodeKey reverses EncodeKey.
func DecodeKey(enc string) (string, error) {
	if enc == "" {
		return "", fmt.Errorf("decoding storage key: empty")
	}
	var b strings.Builder
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		switch c {
		case '.':
			b.WriteByte('/')
		case '=':
			b.WriteByte('.')
		case '_':
			if i+2 >= len(enc) {
				return "", fmt.Errorf("decoding storage key %q: truncated escape at %d", enc, i)
			}
			hi, ok1 := unhex(enc[i+1])
			lo, ok2 := unhex(enc[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("decoding storage key %q: bad escape at %d", enc, i)
			}
			b.WriteByte(hi<<4 | lo)
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// hostOfSiteKey returns the certificate subject a certificates/<issuer>/<site>/...
// key belongs to, for fencing writes under the issue lock.
func hostOfSiteKey(segs []string) (string, bool) {
	if len(segs) < 4 || segs[0] != "certificates" {
		return "", false
	}
	site := segs[2]
	// certmagic's KeyBuilder.Safe spells "*" as "wildcard_".
	if rest, ok := strings.CutPrefix(site, "wildcard_"); ok {
		site = "*" + rest
	}
	return normalizeOrLower(site), true
}
