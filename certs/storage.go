package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/store"
)

// DefaultLockTTL is how long a certificate lock outlives a holder that died
// without releasing it. A live holder renews it every TTL/3.
const DefaultLockTTL = 20 * time.Second

// Options configure a Storage.
type Options struct {
	// LockTTL is the lease TTL of every lock; default DefaultLockTTL, at
	// least store.MinLeaseTTL.
	LockTTL time.Duration
	// Holder names this process in lock records and busy errors; default
	// "<hostname>:<pid>".
	Holder string
	// LockPollMax caps the wait between two attempts to take a busy lock
	// (a watch on the lock key usually wakes the waiter sooner); default 1s.
	LockPollMax time.Duration
	// Logger receives debug logs; default none.
	Logger *zap.Logger
}

// Storage is a certmagic.Storage (with TryLocker and LockLeaseRenewer) on
// the store's certificates bucket and its leases.
//
// It is safe for concurrent use. Every method honours ctx.
type Storage struct {
	st       *store.Store
	kv       jetstream.KeyValue
	opts     Options
	maxValue int
	log      *zap.Logger

	mu   sync.Mutex
	held map[string]*store.Lease // lock key -> our lease
}

// New returns a Storage on s.Certs and s.Locks.
func New(s *store.Store, o Options) (*Storage, error) {
	if s == nil || s.Certs == nil || s.Locks == nil {
		return nil, fmt.Errorf("creating certificate storage: the store has no certificates or locks bucket (not provisioned?)")
	}
	if o.LockTTL == 0 {
		o.LockTTL = DefaultLockTTL
	}
	if o.LockTTL < store.MinLeaseTTL {
		return nil, fmt.Errorf("creating certificate storage: lock ttl %s below the minimum %s", o.LockTTL, store.MinLeaseTTL)
	}
	if o.Holder == "" {
		o.Holder = store.DefaultHolder()
	}
	if o.LockPollMax <= 0 {
		o.LockPollMax = time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	max := int(s.NC.MaxPayload())
	if max <= 0 {
		max = 1 << 20
	}
	return &Storage{st: s, kv: s.Certs, opts: o, maxValue: max, log: o.Logger, held: make(map[string]*store.Lease)}, nil
}

// MaxValueSize is the largest value Store accepts: the NATS server's max
// payload as announced to this connection.
func (s *Storage) MaxValueSize() int { return s.maxValue }

func (s *Storage) debug(msg string, fields ...zap.Field) {
	if c := s.log.Check(zapcore.DebugLevel, msg); c != nil {
		c.Write(fields...)
	}
}

// Store puts value at key, replacing any value there. A write to a
// certificate resource while this process holds that host's issue lock is
// fenced: it is refused if the lease is no longer ours (a holder paused past
// expiry must not overwrite the new holder's certificate).
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	enc, err := EncodeKey(key)
	if err != nil {
		return fmt.Errorf("storing: %w", err)
	}
	if len(value) > s.maxValue {
		return &store.Error{Code: store.CodeInvalid,
			Message: fmt.Sprintf("storing %s: value of %d bytes exceeds the NATS max payload of %d bytes", key, len(value), s.maxValue),
			Detail:  map[string]string{"key": key, "size": fmt.Sprint(len(value)), "max": fmt.Sprint(s.maxValue)}}
	}
	if err := s.fence(ctx, key); err != nil {
		return fmt.Errorf("storing %s: %w", key, err)
	}
	if _, err := s.kv.Put(ctx, enc, value); err != nil {
		return store.Classify(fmt.Errorf("storing %s: %w", key, err))
	}
	s.debug("stored", zap.String("key", key), zap.Int("size", len(value)))
	return nil
}

// fence checks the issue lease of key's host, if this process holds it.
func (s *Storage) fence(ctx context.Context, key string) error {
	segs, err := splitKey(key)
	if err != nil {
		return err
	}
	host, ok := hostOfSiteKey(canonicalSegments(segs))
	if !ok {
		return nil
	}
	s.mu.Lock()
	l := s.held[store.CertLockKey(host)]
	s.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Check(ctx)
}

// Load returns the value at key, or an error wrapping fs.ErrNotExist.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	enc, err := EncodeKey(key)
	if err != nil {
		return nil, fmt.Errorf("loading: %w", err)
	}
	ent, err := s.kv.Get(ctx, enc)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("loading %s: %w", key, fs.ErrNotExist)
		}
		return nil, store.Classify(fmt.Errorf("loading %s: %w", key, err))
	}
	return ent.Value(), nil
}

// Delete removes key and, if key is a directory, every key under it. A
// missing key is not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	enc, err := EncodeKey(key)
	if err != nil {
		return fmt.Errorf("deleting: %w", err)
	}
	children, err := s.keys(ctx, enc+".>")
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	// Only write a delete marker for a file that exists: markers of keys
	// that never existed would pile up in the bucket.
	if _, err := s.kv.Get(ctx, enc); err == nil {
		children = append(children, enc)
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return store.Classify(fmt.Errorf("deleting %s: %w", key, err))
	}
	for _, k := range children {
		if err := s.kv.Delete(ctx, k); err != nil {
			return store.Classify(fmt.Errorf("deleting %s (at %s): %w", key, k, err))
		}
	}
	s.debug("deleted", zap.String("key", key), zap.Int("keys", len(children)))
	return nil
}

// Exists reports whether key is a file or a directory (a prefix of a file).
func (s *Storage) Exists(ctx context.Context, key string) bool {
	enc, err := EncodeKey(key)
	if err != nil {
		return false
	}
	if _, err := s.kv.Get(ctx, enc); err == nil {
		return true
	}
	ok, err := s.hasChildren(ctx, enc)
	return err == nil && ok
}

// List returns the keys under prefix ("" is the root), sorted. Like
// certmagic's FileStorage, a non-recursive list holds the immediate children
// (files and directories); a recursive one every file and directory below
// prefix. Only keys under prefix are read from the server (a subject filter),
// never the whole bucket. An empty result is fs.ErrNotExist.
func (s *Storage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	enc, err := encodePrefix(prefix)
	if err != nil {
		return nil, fmt.Errorf("listing: %w", err)
	}
	filter := ">"
	if enc != "" {
		filter = enc + ".>"
	}
	keys, err := s.keys(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", prefix, err)
	}
	canon := ""
	if prefix != "" {
		canon, _ = CanonicalKey(prefix)
	}
	seen := make(map[string]struct{})
	for _, k := range keys {
		full, err := DecodeKey(k)
		if err != nil {
			s.debug("skipping undecodable key", zap.String("key", k), zap.Error(err))
			continue
		}
		rel := full
		if canon != "" {
			rel = strings.TrimPrefix(full, canon+"/")
		}
		parts := strings.Split(rel, "/")
		if !recursive {
			parts = parts[:1]
		}
		for i := range parts {
			p := strings.Join(parts[:i+1], "/")
			if canon != "" {
				p = canon + "/" + p
			}
			seen[p] = struct{}{}
		}
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("listing %s: %w", prefix, fs.ErrNotExist)
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// Stat describes key: a file with its size and modification time, or a
// directory (IsTerminal false).
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	enc, err := EncodeKey(key)
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("stat: %w", err)
	}
	canon, _ := CanonicalKey(key)
	ent, err := s.kv.Get(ctx, enc)
	if err == nil {
		return certmagic.KeyInfo{Key: canon, Modified: ent.Created(), Size: int64(len(ent.Value())), IsTerminal: true}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return certmagic.KeyInfo{}, store.Classify(fmt.Errorf("stat %s: %w", key, err))
	}
	ok, err := s.hasChildren(ctx, enc)
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if !ok {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, fs.ErrNotExist)
	}
	return certmagic.KeyInfo{Key: canon, IsTerminal: false}, nil
}

// keys lists the live KV keys matching filter.
func (s *Storage) keys(ctx context.Context, filter string) ([]string, error) {
	kl, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, store.Classify(fmt.Errorf("listing keys %s: %w", filter, err))
	}
	defer kl.Stop()
	var out []string
	seen := make(map[string]struct{})
	for {
		select {
		case <-ctx.Done():
			return nil, store.Classify(fmt.Errorf("listing keys %s: %w", filter, ctx.Err()))
		case k, ok := <-kl.Keys():
			if !ok {
				// The lister also ends when ctx does: never return a
				// partial list as if it were complete.
				if err := ctx.Err(); err != nil {
					return nil, store.Classify(fmt.Errorf("listing keys %s: %w", filter, err))
				}
				return out, nil
			}
			// The lister may repeat a key that is written while it runs.
			if _, dup := seen[k]; !dup {
				seen[k] = struct{}{}
				out = append(out, k)
			}
		}
	}
}

func (s *Storage) hasChildren(ctx context.Context, enc string) (bool, error) {
	ks, err := s.keys(ctx, enc+".>")
	return len(ks) > 0, err
}

// ControlPlane is the control-plane store this storage writes to, so other
// edgeplane modules in the same process (the ACME budget, the renewal
// worker) share its connection instead of opening their own.
func (s *Storage) ControlPlane() *store.Store { return s.st }

// String names the storage in certmagic's and Caddy's logs.
func (s *Storage) String() string { return "edgeplane:" + s.kv.Bucket() }

// Interface guards.
var (
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
)
