package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MinLeaseTTL is the shortest TTL a lease may have: the server expires keys
// with one-second granularity.
const MinLeaseTTL = time.Second

// LeaseHolder is the value stored under a lease key: who holds it and until
// when (advisory; the server's per-key TTL is what expires it).
type LeaseHolder struct {
	Version  int       `json:"version"`
	Holder   string    `json:"holder"`
	Purpose  string    `json:"purpose,omitempty"`
	Acquired time.Time `json:"acquired"`
	Expires  time.Time `json:"expires"`
}

func (r *LeaseHolder) version() int { return r.Version }

// Lease is a held lock in a KV bucket. Its fencing token is the KV revision of
// the latest acquire or renewal: a write the lease protects checks that the
// token is still the key's current revision (Check), so a holder that was
// paused past expiry cannot write.
//
// Acquire is an atomic create-if-absent with a per-key TTL. Renewal
// republishes the key with the TTL header and an expected-last-sequence
// condition: a plain KV Update would drop the TTL and make the lease immortal.
type Lease struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	subj   string
	key    string
	ttl    time.Duration
	holder LeaseHolder

	mu    sync.Mutex
	token uint64
	lost  error

	stop chan struct{}
	done chan struct{}
}

// LeaseOptions configure AcquireLease.
type LeaseOptions struct {
	TTL     time.Duration
	Holder  string
	Purpose string
	// KeepAlive renews the lease every TTL/3 until Release.
	KeepAlive bool
}

// AcquireLease takes key in the store's locks bucket or fails at once with a
// structured busy error naming the current holder.
func (s *Store) AcquireLease(ctx context.Context, key string, o LeaseOptions) (*Lease, error) {
	// A lease guards a mutation: without write quorum, refuse it here,
	// before anything is written.
	if err := s.RequireQuorum(ctx); err != nil {
		return nil, err
	}
	return AcquireLease(ctx, s.JS, s.locks, key, o)
}

// AcquireLease takes key in kv (a bucket with LimitMarkerTTL set).
func AcquireLease(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, o LeaseOptions) (*Lease, error) {
	if o.TTL < MinLeaseTTL {
		return nil, fmt.Errorf("lease %s: ttl %s below the minimum %s", key, o.TTL, MinLeaseTTL)
	}
	now := time.Now()
	l := &Lease{
		kv: kv, js: js, key: key, ttl: o.TTL,
		subj:   kvPutPrefix(js) + "$KV." + kv.Bucket() + "." + key,
		holder: LeaseHolder{Version: RecordVersion, Holder: o.Holder, Purpose: o.Purpose, Acquired: now, Expires: now.Add(o.TTL)},
	}
	data, _ := json.Marshal(l.holder)
	var rev uint64
	var err error
	for attempt := 1; ; attempt++ {
		rev, err = kv.Create(ctx, key, data, jetstream.KeyTTL(o.TTL))
		if err == nil || attempt == staleReadTries || !createReadStale(ctx, kv, key, err) || !waitStale(ctx, attempt) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, busyError(ctx, kv, key)
		}
		return nil, classify(fmt.Errorf("acquiring lease %s: %w", key, err))
	}
	l.token = rev
	if o.KeepAlive {
		l.stop = make(chan struct{})
		l.done = make(chan struct{})
		go l.keepAlive()
	}
	return l, nil
}

// kvPutPrefix is what goes before a KV put's "$KV." subject on js: the API
// prefix, for a client that reaches JetStream by one (as nats.go's KV puts
// do).
func kvPutPrefix(js jetstream.JetStream) string {
	p := strings.TrimSuffix(js.Options().APIPrefix, ".") + "."
	if p == "." || p == jetstream.DefaultAPIPrefix {
		return ""
	}
	return p
}

func busyError(ctx context.Context, kv jetstream.KeyValue, key string) error {
	e := &Error{Code: CodeBusy, Message: fmt.Sprintf("lease %s is held", key), Detail: map[string]string{"key": key}}
	if ent, err := kv.Get(ctx, key); err == nil {
		var h LeaseHolder
		if json.Unmarshal(ent.Value(), &h) == nil {
			e.Message = fmt.Sprintf("lease %s is held by %s", key, h.Holder)
			e.Detail["holder"] = h.Holder
			e.Detail["expires"] = h.Expires.UTC().Format(time.RFC3339)
			if h.Purpose != "" {
				e.Detail["purpose"] = h.Purpose
			}
		}
	}
	return e
}

// Key is the lease's key.
func (l *Lease) Key() string { return l.key }

// TTL is the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

// store is the store l's bucket belongs to, when it rides out elections.
func (l *Lease) store() *Store {
	if kv, ok := l.kv.(electedKV); ok {
		return kv.s
	}
	return nil
}

// Token is the fencing token: the revision of the latest acquire or renewal.
func (l *Lease) Token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// Renew extends the lease by its TTL, keeping the per-key TTL, and only if
// nobody else took the key since our last write.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	now := time.Now()
	h := l.holder
	h.Expires = now.Add(l.ttl)
	data, _ := json.Marshal(h)
	// A renewal whose answer was lost in a leader election is retried; if
	// the retry finds the key moved on, the key holding exactly this
	// renewal means the lost attempt landed.
	var ack *jetstream.PubAck
	err := l.store().ride(ctx, "renewing lease "+l.key, func(ctx context.Context, uncertain bool) (err error) {
		ack, err = l.js.Publish(ctx, l.subj, data,
			jetstream.WithMsgTTL(l.ttl), jetstream.WithExpectLastSequencePerSubject(l.token))
		if err != nil && uncertain && IsWrongLastSequence(err) {
			if ent, gerr := l.kv.Get(ctx, l.key); gerr == nil && bytes.Equal(ent.Value(), data) {
				ack, err = &jetstream.PubAck{Sequence: ent.Revision()}, nil
			}
		}
		return err
	})
	if err != nil {
		if IsWrongLastSequence(err) {
			l.lost = &Error{Code: CodeLeaseLost, Message: fmt.Sprintf("lease %s expired or was taken over", l.key),
				Detail: map[string]string{"key": l.key, "token": fmt.Sprint(l.token)}}
			return l.lost
		}
		return classify(fmt.Errorf("renewing lease %s: %w", l.key, err))
	}
	l.token = ack.Sequence
	l.holder = h
	return nil
}

// Check confirms the lease is still ours: the key's current revision is our
// fencing token. Call it before every write the lease protects.
func (l *Lease) Check(ctx context.Context) error {
	l.mu.Lock()
	token, lost := l.token, l.lost
	l.mu.Unlock()
	if lost != nil {
		return lost
	}
	ent, err := l.kv.Get(ctx, l.key)
	// A revision below our token, or no key while our last write has not
	// expired, can only be a replica that has not caught up yet (revisions
	// only grow): ask again before calling the lease lost.
	for attempt := 1; attempt < staleReadTries && l.readStale(ent, err, token) && waitStale(ctx, attempt); attempt++ {
		ent, err = l.kv.Get(ctx, l.key)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return &Error{Code: CodeLeaseLost, Message: fmt.Sprintf("lease %s expired", l.key),
				Detail: map[string]string{"key": l.key, "token": fmt.Sprint(token)}}
		}
		return classify(fmt.Errorf("checking lease %s: %w", l.key, err))
	}
	if ent.Revision() != token {
		return &Error{Code: CodeLeaseLost, Message: fmt.Sprintf("lease %s was taken over", l.key),
			Detail: map[string]string{"key": l.key, "token": fmt.Sprint(token), "current": fmt.Sprint(ent.Revision())}}
	}
	return nil
}

// Lost reports the error that ended the lease, if the keep-alive lost it.
func (l *Lease) Lost() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

func (l *Lease) keepAlive() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			// A renewal may wait out a leader election for as long as
			// the lease has left.
			l.mu.Lock()
			left := time.Until(l.holder.Expires)
			l.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), max(left, l.ttl/3))
			err := l.Renew(ctx)
			cancel()
			if HasCode(err, CodeLeaseLost) {
				return
			}
		}
	}
}

// Release stops renewal and deletes the key if it is still ours. Releasing a
// lease that expired or was taken over is not an error: there is nothing of
// ours left to remove.
func (l *Lease) Release(ctx context.Context) error {
	if l.stop != nil {
		select {
		case <-l.stop:
		default:
			close(l.stop)
		}
		<-l.done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return nil
	}
	l.lost = &Error{Code: CodeLeaseLost, Message: fmt.Sprintf("lease %s released", l.key)}
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(l.token))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || IsWrongLastSequence(err) {
			return nil
		}
		return classify(fmt.Errorf("releasing lease %s: %w", l.key, err))
	}
	return nil
}

// IsWrongLastSequence reports whether err is JetStream refusing a write whose
// expected last sequence (a KV revision, a lease's fencing token) no longer
// holds: someone else wrote first.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// AcquireLeaseUnchecked is AcquireLease without its quorum check, as
// certmagic's locks (certs.Storage) are taken by gateways: a lost quorum
// fails the lease's own write.
func (s *Store) AcquireLeaseUnchecked(ctx context.Context, key string, o LeaseOptions) (*Lease, error) {
	return AcquireLease(ctx, s.JS, s.locks, key, o)
}

// LockHolder reads who holds the lease under key (CertLockKey,
// DeployLockKey, ...); a lease no one holds is not_found.
func (s *Store) LockHolder(ctx context.Context, key string) (*LeaseHolder, error) {
	var h LeaseHolder
	if _, err := GetJSON(ctx, s.locks, key, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// ListLockHolders calls fn with every lease held, by key (ListJSON).
func (s *Store) ListLockHolders(ctx context.Context, fn func(key string, h *LeaseHolder) error) error {
	return ListJSON(ctx, s, s.locks, ">", fn)
}

// Reads of the locks bucket are direct gets, which any replica answers, one
// a moment behind included: a lease just taken, renewed or released may
// not be there yet. staleReadTries bounds how often a read that can only be
// stale is made again (about a second in all), before it is believed.
const staleReadTries = 8

// waitStale waits before the next of staleReadTries reads, a little longer
// each time; false if ctx ended.
func waitStale(ctx context.Context, attempt int) bool {
	t := time.NewTimer(time.Duration(attempt) * 30 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// createReadStale reports whether a failed Create of key may have read a
// replica behind the leader. nats.go's Create reads the key (a direct get)
// after the leader refused a create at sequence 0, to take over a deleted
// key at its revision: a stale read makes that take-over fail with "wrong
// last sequence", and a key the leader holds but the replica does not yet
// shows as held by nobody.
func createReadStale(ctx context.Context, kv jetstream.KeyValue, key string, err error) bool {
	if IsWrongLastSequence(err) {
		return true
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return false
	}
	_, gerr := kv.Get(ctx, key)
	return errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted)
}

// readStale reports whether what a Check read (ent, err) can only come from
// a replica behind our last write of the lease, at revision token.
func (l *Lease) readStale(ent jetstream.KeyValueEntry, err error, token uint64) bool {
	if err == nil {
		return ent.Revision() < token
	}
	l.mu.Lock()
	expires := l.holder.Expires
	l.mu.Unlock()
	return errors.Is(err, jetstream.ErrKeyNotFound) && time.Now().Before(expires)
}
