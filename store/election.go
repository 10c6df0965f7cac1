package store

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Riding out a leader election. When a storage node dies, each stream and
// bucket it led has no leader until the survivors elect one (seconds, more
// under load): a request meant for the leader is answered by nobody, or by
// a server saying JetStream is temporarily unavailable. With a majority of
// the storage nodes still up this is not a failure, only a wait, so the
// store's operations wait it out, for up to ElectionWait, instead of
// failing the apply, the lease or the heartbeat that met it.
//
// A retried write must not be written twice. Every retry here is decided by
// a guard the server checks: signed appends carry a message ID (the
// stream's duplicate window answers a second copy with the first one's
// acknowledgement), revision-guarded writes carry their expected revision,
// and when a retry of either is refused because an attempt that seemed to
// fail had in fact landed, the record is read back and taken as ours only
// if it holds exactly what we wrote. Plain puts are idempotent as they are.
//
// Only a clustered store rides elections: a single storage node that does
// not answer is down, not electing, and its clients fail fast as before.
// Nor is a minority ridden: when the storage nodes that answer are fewer
// than a quorum, the operation fails at once with quorum_unavailable,
// naming the missing nodes, as RequireQuorum does.

// ElectionWait is how long one store operation waits out a leader election
// before it fails, by default (SetElectionWait changes it).
const ElectionWait = 20 * time.Second

// electionAttempt bounds one attempt during an election: a request sent to
// a leader that has just died is never answered, and waiting for the
// caller's whole deadline would leave no time to retry with the next one.
const electionAttempt = 3 * time.Second

// quorumRecheck is how often a ride asks the storage nodes whether a
// majority of them is still up.
const quorumRecheck = 3 * time.Second

// SetLogger makes s log at debug level each operation that waits out an
// election (and at info when it gives up).
func (s *Store) SetLogger(l *zap.Logger) { s.log = l.Named("store") }

// SetElectionWait changes how long an operation of s waits out a leader
// election (0 disables the wait: the first failure is returned).
func (s *Store) SetElectionWait(d time.Duration) { s.electionWait = d }

// electionSymptom reports whether err is what a request to a stream or
// bucket leader gets while there is none, or while the storage node this
// client is connected to restarts (control storage upgrade): the request
// under way is dropped with the connection (ErrDisconnected), and the
// client reconnects to another node within moments. Either way the write
// may have landed, so the next attempt is uncertain.
func electionSymptom(err error) bool {
	return quorumSymptom(err) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting)
}

// ride runs op until it succeeds, fails otherwise than an election makes
// it fail, ctx ends, or the election wait passes; each attempt gets at
// most electionAttempt. op is told whether an earlier attempt may have
// landed after all (its answer was lost), for the writes whose guard then
// needs a read-back.
func (s *Store) ride(ctx context.Context, what string, op func(ctx context.Context, uncertain bool) error) error {
	if s == nil || !s.clustered || s.electionWait <= 0 {
		return op(ctx, false)
	}
	start := time.Now()
	deadline := start.Add(s.electionWait)
	backoff := 50 * time.Millisecond
	var lastQuorum time.Time
	uncertain := false
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, electionAttempt)
		err := op(actx, uncertain)
		cancel()
		if err == nil {
			if attempt > 1 {
				s.logger().Debug("rode out a storage leader election", zap.String("op", what),
					zap.Int("attempts", attempt), zap.Duration("waited", time.Since(start)))
			}
			return nil
		}
		if !electionSymptom(err) || ctx.Err() != nil {
			return err
		}
		if time.Now().After(deadline) {
			s.logger().Info("gave up waiting for a storage leader election", zap.String("op", what),
				zap.Int("attempts", attempt), zap.Duration("waited", time.Since(start)), zap.Error(err))
			return err
		}
		// A write whose answer timed out may have landed.
		uncertain = true
		if time.Since(lastQuorum) >= quorumRecheck {
			lastQuorum = time.Now()
			if qerr := s.minority(ctx); qerr != nil {
				return qerr
			}
		}
		s.logger().Debug("waiting out a storage leader election", zap.String("op", what),
			zap.Int("attempt", attempt), zap.Error(err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// minority returns a quorum_unavailable error when the storage nodes that
// answer are fewer than a quorum (an election cannot end), nil when they
// are a quorum or when none answered (a connection that is moving to
// another node: keep waiting). The edge roles (agents, meshd, gateways)
// do not ask: most may not, and what they write waits as well as fails.
func (s *Store) minority(ctx context.Context) error {
	if s.apiPrefix != jetstream.DefaultAPIPrefix {
		return nil
	}
	nodes, _ := GatherStorageStatus(ctx, s.NC, s.Names, 500*time.Millisecond)
	if len(nodes) == 0 {
		return nil
	}
	e, majority := quorumLost(nodes, errors.New("no stream leader answered"))
	if majority {
		return nil
	}
	return e
}

func (s *Store) logger() *zap.Logger {
	if s.log == nil {
		return zap.NewNop()
	}
	return s.log
}

// electedJS is a JetStream API whose stream and bucket handles ride out
// leader elections, as does binding them.
type electedJS struct {
	jetstream.JetStream
	s *Store
}

func (js electedJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	var str jetstream.Stream
	err := js.s.ride(ctx, "opening stream "+name, func(ctx context.Context, _ bool) (err error) {
		str, err = js.JetStream.Stream(ctx, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return js.s.electedStream(str), nil
}

func (js electedJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := js.s.ride(ctx, "opening bucket "+bucket, func(ctx context.Context, _ bool) (err error) {
		kv, err = js.JetStream.KeyValue(ctx, bucket)
		return err
	})
	if err != nil {
		return nil, err
	}
	return electedKV{KeyValue: kv, s: js.s}, nil
}

// electedKV is a bucket whose operations ride out leader elections.
type electedKV struct {
	jetstream.KeyValue
	s *Store
}

func (kv electedKV) what(op, key string) string { return op + " " + kv.Bucket() + "/" + key }

func (kv electedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	var ent jetstream.KeyValueEntry
	err := kv.s.ride(ctx, kv.what("get", key), func(ctx context.Context, _ bool) (err error) {
		ent, err = kv.KeyValue.Get(ctx, key)
		return err
	})
	return ent, err
}

func (kv electedKV) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	var ent jetstream.KeyValueEntry
	err := kv.s.ride(ctx, kv.what("get", key), func(ctx context.Context, _ bool) (err error) {
		ent, err = kv.KeyValue.GetRevision(ctx, key, revision)
		return err
	})
	return ent, err
}

func (kv electedKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	var rev uint64
	err := kv.s.ride(ctx, kv.what("put", key), func(ctx context.Context, _ bool) (err error) {
		rev, err = kv.KeyValue.Put(ctx, key, value)
		return err
	})
	return rev, err
}

func (kv electedKV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	return kv.Put(ctx, key, []byte(value))
}

// Create is guarded by "no such key yet": a retry refused because the key
// exists is ours when the key holds exactly what we wrote.
func (kv electedKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	var rev uint64
	err := kv.s.ride(ctx, kv.what("create", key), func(ctx context.Context, uncertain bool) (err error) {
		rev, err = kv.KeyValue.Create(ctx, key, value, opts...)
		if err != nil && uncertain && errors.Is(err, jetstream.ErrKeyExists) {
			if r, ok := kv.landed(ctx, key, value); ok {
				rev = r
				return nil
			}
		}
		return err
	})
	return rev, err
}

// Update is guarded by the revision it replaces: a retry refused because
// the revision moved on is ours when the key holds exactly what we wrote.
func (kv electedKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	var rev uint64
	err := kv.s.ride(ctx, kv.what("update", key), func(ctx context.Context, uncertain bool) (err error) {
		rev, err = kv.KeyValue.Update(ctx, key, value, last)
		if err != nil && uncertain && (IsWrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyExists)) {
			if r, ok := kv.landed(ctx, key, value); ok {
				rev = r
				return nil
			}
		}
		return err
	})
	return rev, err
}

// landed reports whether key holds value (and at which revision): whether
// an attempt whose answer was lost wrote it.
func (kv electedKV) landed(ctx context.Context, key string, value []byte) (uint64, bool) {
	ent, err := kv.KeyValue.Get(ctx, key)
	if err != nil || !bytes.Equal(ent.Value(), value) {
		return 0, false
	}
	return ent.Revision(), true
}

// Delete may be guarded by a revision: a retry refused because the
// revision moved on is ours when the key is gone.
func (kv electedKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return kv.s.ride(ctx, kv.what("delete", key), func(ctx context.Context, uncertain bool) error {
		err := kv.KeyValue.Delete(ctx, key, opts...)
		if err != nil && uncertain && IsWrongLastSequence(err) {
			if _, gerr := kv.KeyValue.Get(ctx, key); errors.Is(gerr, jetstream.ErrKeyNotFound) {
				return nil
			}
		}
		return err
	})
}

// electedStream is a stream whose reads ride out leader elections.
type electedStream struct {
	jetstream.Stream
	s *Store
}

func (s *Store) electedStream(str jetstream.Stream) jetstream.Stream {
	return electedStream{Stream: str, s: s}
}

func (str electedStream) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	var info *jetstream.StreamInfo
	err := str.s.ride(ctx, "info of "+str.CachedInfo().Config.Name, func(ctx context.Context, _ bool) (err error) {
		info, err = str.Stream.Info(ctx, opts...)
		return err
	})
	return info, err
}

func (str electedStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	var m *jetstream.RawStreamMsg
	err := str.s.ride(ctx, "read of "+str.CachedInfo().Config.Name, func(ctx context.Context, _ bool) (err error) {
		m, err = str.Stream.GetMsg(ctx, seq, opts...)
		return err
	})
	return m, err
}

func (str electedStream) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	var m *jetstream.RawStreamMsg
	err := str.s.ride(ctx, "read of "+subject, func(ctx context.Context, _ bool) (err error) {
		m, err = str.Stream.GetLastMsgForSubject(ctx, subject)
		return err
	})
	return m, err
}
