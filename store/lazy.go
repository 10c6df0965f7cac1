package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Binding on first use. Binding a stream or bucket costs a JetStream API
// round trip (its info); binding all of an authority's streams and buckets
// costs about thirty, and a fleet of agents reconnecting after a storage
// node restart would ask them all at once while using a handful. So Open
// binds nothing: each stream and bucket binds the first time it is used
// for something that needs its info, and a bucket's gets and puts, which
// need only its name, never bind it: a get is a direct get of the key's
// last message, a put a publish to the key's subject.

// binding is a stream or bucket handle bound once, by its first user; a
// failure is not kept, so the next use asks again (the authority may be
// provisioned by then).
type binding[T any] struct {
	mu    sync.Mutex
	v     T
	bound bool
}

// get returns the handle, binding it with open (named what, for the
// error) if it is not yet.
func (b *binding[T]) get(ctx context.Context, what string, open func(context.Context) (T, error)) (T, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.bound {
		v, err := open(ctx)
		// The info request is asked again when it went unanswered while
		// the caller still waits: a storage node drops the requests under
		// way as it applies an account update (every revocation), and a
		// command's first use of a bucket failed with nothing else wrong.
		for attempt := 1; err != nil && attempt < bindTries && ctx.Err() == nil && unanswered(err); attempt++ {
			v, err = open(ctx)
		}
		if err != nil {
			return v, classify(fmt.Errorf("opening %s (has `control server` provisioned this authority?): %w", what, err))
		}
		b.v, b.bound = v, true
	}
	return b.v, nil
}

// bindTries bounds how often a bucket's or stream's info is asked for
// when it goes unanswered (each ask waits out JetStream's request timeout,
// 5 s, unless the caller's context ends first).
const bindTries = 3

// unanswered reports whether err is a JetStream request that got no answer.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// lazyKV is a bucket bound on first use.
type lazyKV struct {
	s    *Store
	name string
	kv   binding[jetstream.KeyValue]
}

var _ jetstream.KeyValue = (*lazyKV)(nil)

func (l *lazyKV) bind(ctx context.Context) (jetstream.KeyValue, error) {
	return l.kv.get(ctx, "bucket "+l.name, func(ctx context.Context) (jetstream.KeyValue, error) { return l.s.JS.KeyValue(ctx, l.name) })
}

// subject is key's subject in the bucket's stream.
func (l *lazyKV) subject(key string) string { return "$KV." + l.name + "." + key }

// validKey is nats.go's rule for a key one reads or writes: not empty, no
// empty token, only letters, digits and "-/_=.".
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for _, c := range key {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-/_=.", c)) {
			return false
		}
	}
	return true
}

// Get reads key's last message with a direct get: deleted and purged keys
// are not found, as with nats.go's Get.
func (l *lazyKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if !validKey(key) {
		return nil, jetstream.ErrInvalidKey
	}
	found, err := l.s.lastFor(ctx, "KV_"+l.name, l.subject(key))
	switch {
	case err != nil && isStreamNotFound(err):
		return nil, classify(fmt.Errorf("reading bucket %s (has `control server` provisioned this authority?): %w", l.name, jetstream.ErrBucketNotFound))
	case err != nil:
		return nil, err
	case found == nil:
		return nil, jetstream.ErrKeyNotFound
	}
	// A delete or purge marker, or the marker a key's TTL leaves.
	if found.Header.Get(kvOperationHeader) != "" || found.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil, jetstream.ErrKeyNotFound
	}
	return &kvEntry{bucket: l.name, key: key, value: found.Data, revision: found.Seq, created: found.Time}, nil
}

// isStreamNotFound says whether err is a direct get of a stream that does
// not exist: no one answers the request.
func isStreamNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || strings.Contains(err.Error(), "no responders")
}

// Put publishes value to key's subject: the bucket's stream stores it. A
// put rides out a leader election as electedKV's does.
func (l *lazyKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if !validKey(key) {
		return 0, jetstream.ErrInvalidKey
	}
	var rev uint64
	err := l.s.ride(ctx, "put "+l.name+"/"+key, func(ctx context.Context, _ bool) error {
		ack, err := l.s.JS.Publish(ctx, kvPutPrefix(l.s.JS)+l.subject(key), value)
		if err != nil {
			return err
		}
		rev = ack.Sequence
		return nil
	})
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return 0, classify(fmt.Errorf("writing bucket %s (has `control server` provisioned this authority?): %w", l.name, err))
	}
	return rev, err
}

func (l *lazyKV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	return l.Put(ctx, key, []byte(value))
}

func (l *lazyKV) Bucket() string { return l.name }

func (l *lazyKV) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.GetRevision(ctx, key, revision)
}

func (l *lazyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return 0, err
	}
	return kv.Create(ctx, key, value, opts...)
}

func (l *lazyKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return 0, err
	}
	return kv.Update(ctx, key, value, revision)
}

func (l *lazyKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	kv, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return kv.Delete(ctx, key, opts...)
}

func (l *lazyKV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	kv, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return kv.Purge(ctx, key, opts...)
}

func (l *lazyKV) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.Watch(ctx, keys, opts...)
}

func (l *lazyKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.WatchAll(ctx, opts...)
}

func (l *lazyKV) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.WatchFiltered(ctx, keys, opts...)
}

func (l *lazyKV) Keys(ctx context.Context, opts ...jetstream.WatchOpt) ([]string, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.Keys(ctx, opts...)
}

func (l *lazyKV) ListKeys(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyLister, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.ListKeys(ctx, opts...)
}

func (l *lazyKV) ListKeysFiltered(ctx context.Context, filters ...string) (jetstream.KeyLister, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.ListKeysFiltered(ctx, filters...)
}

func (l *lazyKV) History(ctx context.Context, key string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.History(ctx, key, opts...)
}

func (l *lazyKV) PurgeDeletes(ctx context.Context, opts ...jetstream.KVPurgeOpt) error {
	kv, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return kv.PurgeDeletes(ctx, opts...)
}

func (l *lazyKV) Status(ctx context.Context) (jetstream.KeyValueStatus, error) {
	kv, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return kv.Status(ctx)
}

// kvEntry is a key's value as a direct get read it.
type kvEntry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
}

func (e *kvEntry) Bucket() string                  { return e.bucket }
func (e *kvEntry) Key() string                     { return e.key }
func (e *kvEntry) Value() []byte                   { return e.value }
func (e *kvEntry) Revision() uint64                { return e.revision }
func (e *kvEntry) Created() time.Time              { return e.created }
func (e *kvEntry) Delta() uint64                   { return 0 }
func (e *kvEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// lazyStream is a stream bound on first use.
type lazyStream struct {
	s    *Store
	name string
	str  binding[jetstream.Stream]
}

var _ jetstream.Stream = (*lazyStream)(nil)

func (l *lazyStream) bind(ctx context.Context) (jetstream.Stream, error) {
	return l.str.get(ctx, "stream "+l.name, func(ctx context.Context) (jetstream.Stream, error) { return l.s.JS.Stream(ctx, l.name) })
}

// CachedInfo is the info the stream was bound with, binding it now if it
// was not (with no context to bound that by: bindTimeout).
func (l *lazyStream) CachedInfo() *jetstream.StreamInfo {
	ctx, cancel := context.WithTimeout(context.Background(), bindTimeout)
	defer cancel()
	str, err := l.bind(ctx)
	if err != nil {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: l.name}}
	}
	return str.CachedInfo()
}

// ListConsumers and ConsumerNames list nothing when the stream cannot be
// bound: their listers carry no error of their own until read.
func (l *lazyStream) ListConsumers(ctx context.Context) jetstream.ConsumerInfoLister {
	str, err := l.bind(ctx)
	if err != nil {
		return failedLister{err}
	}
	return str.ListConsumers(ctx)
}

func (l *lazyStream) ConsumerNames(ctx context.Context) jetstream.ConsumerNameLister {
	str, err := l.bind(ctx)
	if err != nil {
		return failedLister{err}
	}
	return str.ConsumerNames(ctx)
}

func (l *lazyStream) CreateOrUpdateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.CreateOrUpdateConsumer(ctx, cfg)
}

func (l *lazyStream) CreateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.CreateConsumer(ctx, cfg)
}

func (l *lazyStream) UpdateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.UpdateConsumer(ctx, cfg)
}

func (l *lazyStream) OrderedConsumer(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.OrderedConsumer(ctx, cfg)
}

func (l *lazyStream) Consumer(ctx context.Context, consumer string) (jetstream.Consumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.Consumer(ctx, consumer)
}

func (l *lazyStream) PauseConsumer(ctx context.Context, consumer string, pauseUntil time.Time) (*jetstream.ConsumerPauseResponse, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.PauseConsumer(ctx, consumer, pauseUntil)
}

func (l *lazyStream) ResumeConsumer(ctx context.Context, consumer string) (*jetstream.ConsumerPauseResponse, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.ResumeConsumer(ctx, consumer)
}

func (l *lazyStream) ResetConsumer(ctx context.Context, consumer string) (*jetstream.ConsumerResetResponse, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.ResetConsumer(ctx, consumer)
}

func (l *lazyStream) ResetConsumerToSequence(ctx context.Context, consumer string, seq uint64) (*jetstream.ConsumerResetResponse, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.ResetConsumerToSequence(ctx, consumer, seq)
}

func (l *lazyStream) CreateOrUpdatePushConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.PushConsumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.CreateOrUpdatePushConsumer(ctx, cfg)
}

func (l *lazyStream) CreatePushConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.PushConsumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.CreatePushConsumer(ctx, cfg)
}

func (l *lazyStream) UpdatePushConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.PushConsumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.UpdatePushConsumer(ctx, cfg)
}

func (l *lazyStream) PushConsumer(ctx context.Context, consumer string) (jetstream.PushConsumer, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.PushConsumer(ctx, consumer)
}

func (l *lazyStream) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.Info(ctx, opts...)
}

func (l *lazyStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.GetMsg(ctx, seq, opts...)
}

func (l *lazyStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	str, err := l.bind(ctx)
	if err != nil {
		return nil, err
	}
	return str.GetLastMsgForSubject(ctx, subject)
}

func (l *lazyStream) DeleteConsumer(ctx context.Context, consumer string) error {
	str, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return str.DeleteConsumer(ctx, consumer)
}

func (l *lazyStream) UnpinConsumer(ctx context.Context, consumer string, group string) error {
	str, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return str.UnpinConsumer(ctx, consumer, group)
}

func (l *lazyStream) Purge(ctx context.Context, opts ...jetstream.StreamPurgeOpt) error {
	str, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return str.Purge(ctx, opts...)
}

func (l *lazyStream) DeleteMsg(ctx context.Context, seq uint64) error {
	str, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return str.DeleteMsg(ctx, seq)
}

func (l *lazyStream) SecureDeleteMsg(ctx context.Context, seq uint64) error {
	str, err := l.bind(ctx)
	if err != nil {
		return err
	}
	return str.SecureDeleteMsg(ctx, seq)
}

// failedLister is a consumer listing that could not start.
type failedLister struct{ err error }

func (f failedLister) Info() <-chan *jetstream.ConsumerInfo {
	ch := make(chan *jetstream.ConsumerInfo)
	close(ch)
	return ch
}

func (f failedLister) Name() <-chan string {
	ch := make(chan string)
	close(ch)
	return ch
}

func (f failedLister) Err() error { return f.err }
