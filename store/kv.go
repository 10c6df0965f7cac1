package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// record is a wire record with a schema version.
type record interface{ version() int }

// GetJSON reads key from kv into v and returns its revision. A missing key is
// a structured not_found error; a record filed under another key than its
// body names is refused (invalid).
func GetJSON(ctx context.Context, kv jetstream.KeyValue, key string, v record) (uint64, error) {
	ent, err := kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, &Error{Code: CodeNotFound, Message: fmt.Sprintf("%s not found in %s", key, kv.Bucket()),
				Detail: map[string]string{"bucket": kv.Bucket(), "key": key}}
		}
		return 0, classify(fmt.Errorf("reading %s/%s: %w", kv.Bucket(), key, err))
	}
	if err := Decode(kv.Bucket()+"/"+key, ent.Value(), v); err != nil {
		return 0, err
	}
	// A record is taken only under the key its body names.
	if k, ok := v.(keyed); ok {
		if err := k.KeyOK(key); err != nil {
			return 0, &Error{Code: CodeInvalid, Message: fmt.Sprintf("%s/%s: %v", kv.Bucket(), key, err),
				Detail: map[string]string{"bucket": kv.Bucket(), "key": key}}
		}
	}
	return ent.Revision(), nil
}

// PutJSON writes v under key and returns the new revision.
func PutJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (uint64, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encoding %s/%s: %w", kv.Bucket(), key, err)
	}
	rev, err := kv.Put(ctx, key, data)
	if err != nil {
		return 0, classify(fmt.Errorf("writing %s/%s: %w", kv.Bucket(), key, err))
	}
	return rev, nil
}

// keyed is a record whose key is derived from its body. A reader takes it
// only under the key its body names: a writer allowed one key must not be
// able to pass a record off as another's (an agent's instance record
// claiming another machine, a heartbeat claiming another node).
type keyed interface {
	KeyOK(key string) error
}

// SkippedRecords counts the records ListJSON skipped, in this process.
var SkippedRecords atomic.Uint64

// ListOption tunes ListJSON.
type ListOption func(*listConfig)

type listConfig struct {
	onSkip func(key string, err error)
	// except leaves out, unread, the keys it says yes to: records of
	// another kind filed in the same bucket.
	except func(key string) bool
}

// OnSkip makes ListJSON tell fn of each record it skips, with why.
func OnSkip(fn func(key string, err error)) ListOption {
	return func(c *listConfig) { c.onSkip = fn }
}

// ListJSON decodes every value whose key matches filter (a KV key filter such
// as "ns.>") and calls fn with each, in key order; an empty bucket is not an
// error. A record that cannot be decoded, is of a newer version than this
// build understands, or whose body disagrees with its key is skipped and
// counted (OnSkip says which), never fatal: one bad record must not stop
// every reader.
func ListJSON[T any, P interface {
	*T
	record
}](ctx context.Context, s *Store, kv jetstream.KeyValue, filter string, fn func(key string, v *T) error, opts ...ListOption) error {
	var cfg listConfig
	for _, o := range opts {
		o(&cfg)
	}
	entries, err := s.ScanKV(ctx, kv, filter)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if cfg.except != nil && cfg.except(e.Key) {
			continue
		}
		v := new(T)
		if err := DecodeKeyed(kv.Bucket(), e.Key, e.Value, P(v)); err != nil {
			SkippedRecords.Add(1)
			if cfg.onSkip != nil {
				cfg.onSkip(e.Key, err)
			}
			continue
		}
		if err := fn(e.Key, v); err != nil {
			return err
		}
	}
	return nil
}

// DecodeKeyed decodes the value of bucket/key into v and, for a keyed record,
// checks that its body agrees with key. Every reader of a record an
// untrusted role wrote takes it through here (or ListJSON).
func DecodeKeyed(bucket, key string, value []byte, v record) error {
	if err := json.Unmarshal(value, v); err != nil || v.version() > RecordVersion {
		// Decode names what is wrong (and the entry).
		if derr := Decode(bucket+"/"+key, value, v); derr != nil {
			return derr
		}
		return fmt.Errorf("%s/%s: %v", bucket, key, err)
	}
	if k, ok := v.(keyed); ok {
		if err := k.KeyOK(key); err != nil {
			return fmt.Errorf("%s/%s: %w", bucket, key, err)
		}
	}
	return nil
}
