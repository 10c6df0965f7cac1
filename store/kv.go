package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// record is a wire record with a schema version.
type record interface{ version() int }

// GetJSON reads key from kv into v and returns its revision. A missing key is
// a structured not_found error.
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

// ListJSON decodes every value whose key matches filter (a KV key filter such
// as "ns.>") and calls fn with each; an empty bucket is not an error.
func ListJSON[T any, P interface {
	*T
	record
}](ctx context.Context, kv jetstream.KeyValue, filter string, fn func(key string, v *T) error) error {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return classify(fmt.Errorf("listing %s: %w", kv.Bucket(), err))
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return classify(fmt.Errorf("listing %s: %w", kv.Bucket(), ctx.Err()))
		case ent, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("listing %s: watcher closed", kv.Bucket())
			}
			if ent == nil {
				return nil
			}
			v := new(T)
			if err := json.Unmarshal(ent.Value(), v); err != nil || P(v).version() > RecordVersion {
				// Name the entry only for a refusal: a listing of a large
				// bucket (100k instances at a gateway's start) decodes many.
				return Decode(kv.Bucket()+"/"+ent.Key(), ent.Value(), P(v))
			}
			if err := fn(ent.Key(), v); err != nil {
				return err
			}
		}
	}
}
