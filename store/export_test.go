package store

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LoseAnswers makes the next n writes of s land but their answers be lost
// (the caller sees a timeout), as when the leader that stored a write dies
// before it answers; clustered makes s ride elections as a client of a
// storage cluster does. It covers s.JS (appends, lease renewals) and the
// Machines, Locks and Instances buckets.
func LoseAnswers(s *Store, n int32, clustered bool) {
	lose := new(atomic.Int32)
	lose.Store(n)
	s.clustered = clustered
	s.JS = electedJS{JetStream: lossyJS{JetStream: s.JS.(electedJS).JetStream, lose: lose}, s: s}
	for _, kv := range []*jetstream.KeyValue{&s.machines, &s.locks, &s.instances} {
		// A bucket bound lazily (Open) puts through s.JS, lossy now.
		if e, ok := (*kv).(electedKV); ok {
			*kv = electedKV{KeyValue: lossyKV{KeyValue: e.KeyValue, lose: lose}, s: s}
		}
	}
}

// lost turns err into a lost answer when one is still to be lost.
func lost(lose *atomic.Int32, err error) error {
	if err == nil && lose.Add(-1) >= 0 {
		return context.DeadlineExceeded
	}
	return err
}

type lossyJS struct {
	jetstream.JetStream
	lose *atomic.Int32
}

func (js lossyJS) Publish(ctx context.Context, subj string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := js.JetStream.Publish(ctx, subj, data, opts...)
	if err = lost(js.lose, err); err != nil {
		return nil, err
	}
	return ack, nil
}

func (js lossyJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := js.JetStream.PublishMsg(ctx, m, opts...)
	if err = lost(js.lose, err); err != nil {
		return nil, err
	}
	return ack, nil
}

type lossyKV struct {
	jetstream.KeyValue
	lose *atomic.Int32
}

func (kv lossyKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := kv.KeyValue.Put(ctx, key, value)
	return rev, lost(kv.lose, err)
}

func (kv lossyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, value, opts...)
	return rev, lost(kv.lose, err)
}

func (kv lossyKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, value, last)
	return rev, lost(kv.lose, err)
}

func (kv lossyKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return lost(kv.lose, kv.KeyValue.Delete(ctx, key, opts...))
}

// BucketOf and StreamOf are the store's own handle of the bucket or stream
// named name (bound on first use after Open, riding elections after
// Provision), for the tests of the handles themselves; nil when s's
// layout has none of that name. Other tests bind by name
// (storetest.Bucket).
func BucketOf(s *Store, name string) jetstream.KeyValue {
	_, buckets := s.layout()
	for _, b := range buckets {
		if b.cfg.Bucket == name {
			return *b.dst
		}
	}
	return nil
}

func StreamOf(s *Store, name string) jetstream.Stream {
	streams, _ := s.layout()
	for _, st := range streams {
		if st.cfg.Name == name {
			return *st.dst
		}
	}
	return nil
}
