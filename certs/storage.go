package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// LockPollMax caps the wait between two attempts to take a busy lock;
	// default 1s.
	LockPollMax time.Duration
	// Logger receives debug logs; default none.
	Logger *zap.Logger
	// LocalDir, if set, keeps a node-local copy of the certificates, keys
	// and OCSP staples this storage loads or stores (files 0600, the same
	// trust as Caddy's own file storage), from which Load, Stat, Exists and
	// List answer while the store is unreachable. When the store answers
	// again the copy yields to it.
	LocalDir string
}

// Storage is a certmagic.Storage (with TryLocker and LockLeaseRenewer) on
// the store's certificates bucket and its leases.
//
// It works without the store: reads are answered from the local copy (see
// Options.LocalDir) while the store is unreachable, and writes and locks
// fail at once with store_unavailable, so nothing that needs the fleet's
// agreement (an order, a lock) happens behind its back.
//
// It is safe for concurrent use. Every method honours ctx.
type Storage struct {
	link  *store.Link
	local *localCopy // nil without Options.LocalDir
	opts  Options
	log   *zap.Logger

	mu   sync.Mutex
	held map[string]*store.Lease // lock key -> our lease
	// refusedNames are the locks and issuances refused in this outage,
	// each logged once.
	refusedNames map[string]bool
	// refreshed is told the names whose certificates followStore took
	// from the store.
	refreshed func(ctx context.Context, names []string)

	localReads, refused atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Storage on the certificates bucket and the leases of the
// store l binds. With Options.LocalDir it keeps the local copy in step
// with the store every time l connects, until Close.
func New(l *store.Link, o Options) (*Storage, error) {
	if l == nil {
		return nil, fmt.Errorf("creating certificate storage: no store link")
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
	s := &Storage{link: l, opts: o, log: o.Logger, held: make(map[string]*store.Lease), done: make(chan struct{})}
	if o.LocalDir == "" {
		close(s.done)
		return s, nil
	}
	s.local = &localCopy{fs: &certmagic.FileStorage{Path: o.LocalDir}}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.followStore(ctx)
	return s, nil
}

// Close stops keeping the local copy in step with the store. The link is
// the caller's to close.
func (s *Storage) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	<-s.done
}

// followStore brings the local copy in line with the store each time the
// link connects: what was renewed or removed elsewhere meanwhile wins.
func (s *Storage) followStore(ctx context.Context) {
	defer close(s.done)
	for {
		changed := s.link.Changed()
		if st := s.link.Store(); st != nil {
			s.mu.Lock()
			s.refusedNames = nil
			s.mu.Unlock()
			changed, err := s.local.follow(ctx, st)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("bringing the local certificate copy in line with the store", zap.Error(err))
			}
			if len(changed) > 0 {
				s.log.Info("local certificate copy brought in line with the store", zap.Strings("changed", changed))
				s.tellRefreshed(ctx, changed)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// SetRefreshed makes fn be told, each time the local copy follows the store,
// the names whose certificates it took from the store (renewed or removed
// elsewhere meanwhile), so that whoever serves them can load the store's.
func (s *Storage) SetRefreshed(fn func(ctx context.Context, names []string)) {
	s.mu.Lock()
	s.refreshed = fn
	s.mu.Unlock()
}

func (s *Storage) tellRefreshed(ctx context.Context, keys []string) {
	s.mu.Lock()
	fn := s.refreshed
	s.mu.Unlock()
	var names []string
	for _, k := range keys {
		if n := certificateName(k); n != "" {
			names = append(names, n)
		}
	}
	if fn != nil && len(names) > 0 {
		fn(ctx, names)
	}
}

// readStore is the store for a read: nil while it is unreachable, so the
// read falls back to the local copy at once (once the first dial has an
// outcome).
func (s *Storage) readStore(ctx context.Context) *store.Store {
	if st := s.link.Store(); st != nil {
		return st
	}
	s.link.Settle(ctx)
	return s.link.Store()
}

// writeStore is the store for a write or a lock (store.Link.Writable),
// counting a refusal.
func (s *Storage) writeStore(ctx context.Context, op string) (*store.Store, error) {
	st, err := s.link.Writable(ctx, op)
	if err != nil {
		s.refused.Add(1)
	}
	return st, err
}

// logRefused logs, once per name and outage, that a lock or an issuance
// was refused: one line per host, not one per handshake.
func (s *Storage) logRefused(msg, name string, err error) {
	s.mu.Lock()
	first := !s.refusedNames[name]
	if first {
		if s.refusedNames == nil {
			s.refusedNames = make(map[string]bool)
		}
		s.refusedNames[name] = true
	}
	s.mu.Unlock()
	if first {
		s.log.Warn(msg, zap.String("name", name), zap.Error(err))
	}
}

// RefuseIssuance is store_unavailable (logged once per name and outage)
// for a name whose certificate cannot be had now: the store is unreachable,
// so there is no lock, no place in the fleet's order budget and no place
// for a new certificate, and the local copy holds none for name. It is nil
// while the store answers, and for a name the local copy can serve. Asked
// before a handshake looks for a certificate, it fails the handshake at
// once and keeps every order of an outage away from the CA.
func (s *Storage) RefuseIssuance(ctx context.Context, name string) error {
	if s.readStore(ctx) != nil || s.local.holdsCertificate(ctx, name) {
		return nil
	}
	s.refused.Add(1)
	err := s.unavailable("issuing a certificate for " + name)
	s.logRefused("certificate issuance refused: the store is unreachable and the local copy holds no certificate for this name", name, err)
	return err
}

// unavailable is the store_unavailable error refusing op.
func (s *Storage) unavailable(op string) error { return s.link.Unavailable(op) }

// LocalReads counts the reads answered from the local copy because the
// store was unreachable.
func (s *Storage) LocalReads() uint64 { return s.localReads.Load() }

// Refused counts the writes and locks refused because the store was
// unreachable.
func (s *Storage) Refused() uint64 { return s.refused.Load() }

// Connected reports whether the store answers now.
func (s *Storage) Connected() bool { return s.link.Store() != nil }

// MaxValueSize is the largest value Store accepts: the certificates
// bucket's limit, or the NATS server's max payload as announced to this
// connection if that is smaller; 0 while the store is unreachable.
func (s *Storage) MaxValueSize() int {
	if st := s.link.Store(); st != nil {
		return maxValue(st)
	}
	return 0
}

func maxValue(st *store.Store) int {
	if m := int(st.NC.MaxPayload()); m > 0 && m < store.MaxCertValue {
		return m
	}
	return store.MaxCertValue
}

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
	st, err := s.writeStore(ctx, "storing "+key)
	if err != nil {
		return err
	}
	if max := maxValue(st); len(value) > max {
		return &store.Error{Code: store.CodeInvalid,
			Message: fmt.Sprintf("storing %s: value of %d bytes exceeds the NATS max payload of %d bytes", key, len(value), max),
			Detail:  map[string]string{"key": key, "size": fmt.Sprint(len(value)), "max": fmt.Sprint(max)}}
	}
	if err := s.fence(ctx, key); err != nil {
		return fmt.Errorf("storing %s: %w", key, err)
	}
	if _, err := st.PutCert(ctx, enc, value); err != nil {
		return store.Classify(fmt.Errorf("storing %s: %w", key, err))
	}
	s.local.keep(ctx, key, value, time.Now())
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
	st := s.readStore(ctx)
	if st == nil {
		return s.localLoad(ctx, key)
	}
	ent, err := st.GetCert(ctx, enc)
	switch {
	case err == nil:
		s.local.keep(ctx, key, ent.Value(), ent.Created())
		return ent.Value(), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		s.local.forget(ctx, key)
		return nil, fmt.Errorf("loading %s: %w", key, fs.ErrNotExist)
	case store.HasCode(store.Classify(err), store.CodeUnavailable):
		// The store went away under us: the local copy answers.
		return s.localLoad(ctx, key)
	}
	return nil, store.Classify(fmt.Errorf("loading %s: %w", key, err))
}

// localLoad answers Load from the local copy; a key it does not hold is
// store_unavailable, not "does not exist": the store may well have it.
func (s *Storage) localLoad(ctx context.Context, key string) ([]byte, error) {
	if v, ok := s.local.load(ctx, key); ok {
		s.localReads.Add(1)
		return v, nil
	}
	return nil, s.unavailable("loading " + key)
}

// Delete removes key and, if key is a directory, every key under it. A
// missing key is not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	enc, err := EncodeKey(key)
	if err != nil {
		return fmt.Errorf("deleting: %w", err)
	}
	st, err := s.writeStore(ctx, "deleting "+key)
	if err != nil {
		return err
	}
	children, err := keys(ctx, st, enc+".>")
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	// Only write a delete marker for a file that exists: markers of keys
	// that never existed would pile up in the bucket.
	if _, err := st.GetCert(ctx, enc); err == nil {
		children = append(children, enc)
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return store.Classify(fmt.Errorf("deleting %s: %w", key, err))
	}
	for _, k := range children {
		if err := st.DeleteCert(ctx, k); err != nil {
			return store.Classify(fmt.Errorf("deleting %s (at %s): %w", key, k, err))
		}
	}
	s.local.forget(ctx, key)
	s.debug("deleted", zap.String("key", key), zap.Int("keys", len(children)))
	return nil
}

// Exists reports whether key is a file or a directory (a prefix of a file).
func (s *Storage) Exists(ctx context.Context, key string) bool {
	enc, err := EncodeKey(key)
	if err != nil {
		return false
	}
	st := s.readStore(ctx)
	if st == nil {
		s.localReads.Add(1)
		return s.local.exists(ctx, key)
	}
	if _, err := st.GetCert(ctx, enc); err == nil {
		return true
	}
	ok, err := hasChildren(ctx, st, enc)
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
	st := s.readStore(ctx)
	if st == nil {
		if list, ok := s.local.list(ctx, prefix, recursive); ok {
			s.localReads.Add(1)
			return list, nil
		}
		return nil, s.unavailable("listing " + prefix)
	}
	filter := ">"
	if enc != "" {
		filter = enc + ".>"
	}
	keys, err := keys(ctx, st, filter)
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
	st := s.readStore(ctx)
	if st == nil {
		if info, ok := s.local.stat(ctx, key); ok {
			s.localReads.Add(1)
			return info, nil
		}
		return certmagic.KeyInfo{}, s.unavailable("stat " + key)
	}
	ent, err := st.GetCert(ctx, enc)
	if err == nil {
		return certmagic.KeyInfo{Key: canon, Modified: ent.Created(), Size: int64(len(ent.Value())), IsTerminal: true}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return certmagic.KeyInfo{}, store.Classify(fmt.Errorf("stat %s: %w", key, err))
	}
	ok, err := hasChildren(ctx, st, enc)
	if err != nil {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if !ok {
		return certmagic.KeyInfo{}, fmt.Errorf("stat %s: %w", key, fs.ErrNotExist)
	}
	return certmagic.KeyInfo{Key: canon, IsTerminal: false}, nil
}

// keys lists the live keys of the certificates bucket matching filter.
func keys(ctx context.Context, st *store.Store, filter string) ([]string, error) {
	entries, err := st.ScanCerts(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("listing keys %s: %w", filter, err)
	}
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out, nil
}

func hasChildren(ctx context.Context, st *store.Store, enc string) (bool, error) {
	ks, err := keys(ctx, st, enc+".>")
	return len(ks) > 0, err
}

// Link is the link to the control-plane store this storage writes to, so
// other edgeplane modules in the same process (the ACME budget, the renewal
// worker) share its connection instead of opening their own.
func (s *Storage) Link() *store.Link { return s.link }

// String names the storage in certmagic's and Caddy's logs.
func (s *Storage) String() string { return "edgeplane:" + s.link.Names().CertsBucket() }

// Interface guards.
var (
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
)
