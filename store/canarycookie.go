package store

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The sticky canary's bucket cookie (StickyCookie) is what every gateway
// of the fleet agrees on: a client carries it from one gateway to the
// next. Its value is "BUCKET.MAC", the MAC an HMAC-SHA256 under the
// fleet's CanaryCookieKey over the canary's deploy and the bucket, so a
// client can neither choose its bucket (and so its side of the split) nor
// carry a bucket from one canary to another. Only the control plane writes
// the key and only gateways read it.

// CanaryCookieKey is the fleet's key for the bucket cookie's MAC. Key:
// CanaryCookieKeyName in the CanaryKeys bucket.
type CanaryCookieKey struct {
	Version   int       `json:"version"`
	Key       []byte    `json:"key"`
	CreatedAt time.Time `json:"created_at"`
}

func (r *CanaryCookieKey) version() int { return r.Version }

// CanaryCookieKeyName is the key of the fleet's CanaryCookieKey.
const CanaryCookieKeyName = "cookie"

// canaryCookieKeySize is the key's length in bytes (HMAC-SHA256's block
// of entropy).
const canaryCookieKeySize = 32

// EnsureCanaryCookieKey returns the fleet's canary cookie key, making it
// first if there is none (the control plane does, when it provisions the
// store). Concurrent callers agree on one key.
func (s *Store) EnsureCanaryCookieKey(ctx context.Context) (*CanaryCookieKey, error) {
	if k, err := s.CanaryCookieKeyOf(ctx); err != nil || k != nil {
		return k, err
	}
	k := &CanaryCookieKey{Version: RecordVersion, Key: make([]byte, canaryCookieKeySize), CreatedAt: time.Now().UTC()}
	if _, err := rand.Read(k.Key); err != nil {
		return nil, fmt.Errorf("making the canary cookie key: %w", err)
	}
	b, err := json.Marshal(k)
	if err != nil {
		return nil, err
	}
	if _, err := s.canaryKeys.Create(ctx, CanaryCookieKeyName, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return s.CanaryCookieKeyOf(ctx)
		}
		return nil, classify(fmt.Errorf("writing the canary cookie key: %w", err))
	}
	return k, nil
}

// CanaryCookieKeyOf reads the fleet's canary cookie key, or nil if there
// is none yet.
func (s *Store) CanaryCookieKeyOf(ctx context.Context) (*CanaryCookieKey, error) {
	var k CanaryCookieKey
	if _, err := GetJSON(ctx, s.canaryKeys, CanaryCookieKeyName, &k); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, nil
		}
		return nil, err
	}
	if len(k.Key) != canaryCookieKeySize {
		return nil, Errorf(CodeInvalid, "the canary cookie key is %d bytes, want %d", len(k.Key), canaryCookieKeySize).
			With("bucket", s.Names.CanaryKeysBucket())
	}
	return &k, nil
}

// canaryMACSize is how many bytes of the HMAC a cookie carries: 128 bits,
// more than enough against guessing online.
const canaryMACSize = 16

// canaryMAC is the MAC of bucket (its decimal form) for deploy under key.
func canaryMAC(key []byte, deploy, bucket string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("edgeplane canary bucket v1\x00"))
	m.Write([]byte(deploy))
	m.Write([]byte{0})
	m.Write([]byte(bucket))
	return m.Sum(nil)[:canaryMACSize]
}

// SignCanaryBucket returns the bucket cookie's value for bucket of the
// canary of deploy.
func SignCanaryBucket(key []byte, deploy string, bucket int) string {
	b := strconv.Itoa(bucket)
	return b + "." + base64.RawURLEncoding.EncodeToString(canaryMAC(key, deploy, b))
}

// CanaryBucketOf returns the bucket a cookie value carries if a gateway of
// this fleet signed it for the canary of deploy and the bucket is in
// range; otherwise ok is false and the client is to be bucketed as a new
// one.
func CanaryBucketOf(key []byte, deploy, value string) (bucket int, ok bool) {
	if len(key) == 0 {
		return 0, false
	}
	b, mac, found := strings.Cut(value, ".")
	if !found {
		return 0, false
	}
	n, err := strconv.Atoi(b)
	if err != nil || n < 0 || n >= CanaryBuckets || strconv.Itoa(n) != b {
		return 0, false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, canaryMAC(key, deploy, b)) {
		return 0, false
	}
	return n, true
}
