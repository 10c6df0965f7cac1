package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/edgeplane/edgeplane/signing"
)

// A routing seal is one signature for a batch of routing events. Verifying
// an ed25519 signature costs tens of microseconds; a SHA-256 over an event
// costs about one. So the control plane files, right before each batch it
// publishes, a seal listing the digest of every event of the batch (over
// subject, sequence and body: what the event's own signature covers), and a
// projection following the stream verifies the seal once and each event by
// its digest.
//
// Every event still carries its own signature: a cold start reads the last
// event of each subject, long after its seal is gone (the seal subject
// keeps its few latest messages like every routing subject), and an event
// no verified seal covers, or one whose digest does not match the seal's,
// is verified by its own signature exactly as if there were no seal.

// SealMax bounds the events one seal covers: a projection applies a batch
// of up to 512 events per view swap, and a seal of 500 digests is ~24 KB.
const SealMax = 500

// RoutingSeal is the body of a seal message.
type RoutingSeal struct {
	Version int `json:"version"`
	// First is the sequence of the first event the seal covers: always
	// the seal's own sequence + 1, which its signature binds.
	First uint64 `json:"first"`
	// Digests are signing.Message digests of the events at First, First+1,
	// ... in order.
	Digests [][]byte `json:"digests"`
}

func (r *RoutingSeal) version() int { return r.Version }

// Seal is a verified seal: what a reader accepts events by.
type Seal struct {
	first   uint64
	digests [][]byte
}

// Covers says whether the seal vouches for m: m's sequence is in its range
// and m is, byte for byte, the message the control plane sealed there.
func (sl *Seal) Covers(m *StoredMsg) bool {
	if sl == nil || m.Seq < sl.first || m.Seq-sl.first >= uint64(len(sl.digests)) {
		return false
	}
	msg := signing.Message{Subject: m.Subject, Seq: m.Seq, Op: m.Header.Get(kvOperationHeader), Body: m.Data}
	d := msg.Digest()
	return bytes.Equal(d[:], sl.digests[m.Seq-sl.first])
}

// last is the last sequence the seal covers.
func (sl *Seal) last() uint64 { return sl.first + uint64(len(sl.digests)) - 1 }

// IsSeal says whether m, a message of the routing stream, is a seal.
func (s *Store) IsSeal(m *StoredMsg) bool { return m.Subject == s.Names.RoutingSealSubject() }

// VerifySeal checks m, a seal message, against s's trust and returns what it
// vouches for. A seal is refused (bad_signature) when its signature does not
// verify, its signer was retired before the last event it covers, or it
// covers anything but the events right after it.
func (s *Store) VerifySeal(ctx context.Context, m *StoredMsg) (*Seal, error) {
	stream := s.Names.RoutingEventsStream()
	what := fmt.Sprintf("routing seal %d", m.Seq)
	if err := s.Verify(ctx, stream, m); err != nil {
		return nil, refusedIntent(what, err)
	}
	var rs RoutingSeal
	if err := Decode("routing seal", m.Data, &rs); err != nil {
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("%s: %v", what, err)}
	}
	switch {
	case rs.First != m.Seq+1:
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("%s covers events from %d, not the ones right after it", what, rs.First)}
	case len(rs.Digests) == 0 || len(rs.Digests) > SealMax:
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("%s covers %d events (1..%d)", what, len(rs.Digests), SealMax)}
	}
	for i, d := range rs.Digests {
		if len(d) != sha256.Size {
			return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("%s: digest %d is %d bytes", what, i, len(d))}
		}
	}
	sl := &Seal{first: rs.First, digests: rs.Digests}
	t, _, err := s.Trust(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.Vouches(stream, signing.SignerOf(m.Header.Get(signing.Header)), sl.last()); err != nil {
		return nil, refusedIntent(what, err)
	}
	return sl, nil
}

// VerifyRouting verifies and decodes msgs, a run of routing stream messages
// in sequence order, as a follower of the stream reads them: a seal among
// them is verified once and vouches for the events and batch parts it
// covers, which are then checked by digest; every other message is
// verified by its own signature (VerifyEvent). *seal is the seal in force
// before msgs (nil for none) and, on return, the one in force after them,
// for the next run: a batch's events may arrive in a later run than its
// seal. events[i], parts[i] and errs[i] belong to msgs[i]: a batch part
// decodes into parts[i] (its events, each with the part's sequence), any
// other event into events[i]; for a seal message errs[i] is why it was
// refused, and events[i] is left empty.
func (s *Store) VerifyRouting(ctx context.Context, msgs []*StoredMsg, seal **Seal) (events []RoutingEvent, parts []*RoutingBatchPart, errs []error) {
	events = make([]RoutingEvent, len(msgs))
	parts = make([]*RoutingBatchPart, len(msgs))
	errs = make([]error, len(msgs))
	// Seals in order first: which seal, if any, vouches for each event.
	by := make([]*Seal, len(msgs))
	cur := *seal
	work := 0 // about how many events msgs hold, to size the workers
	for i, m := range msgs {
		work += 1 + len(m.Data)/2048
		if s.IsSeal(m) {
			cur, errs[i] = s.VerifySeal(ctx, m)
			continue
		}
		if cur != nil && m.Seq <= cur.last() {
			by[i] = cur
		}
	}
	if cur != nil && len(msgs) > 0 && msgs[len(msgs)-1].Seq >= cur.last() {
		cur = nil // spent
	}
	*seal = cur
	one := func(i int) {
		m := msgs[i]
		switch {
		case s.IsSeal(m):
		case s.IsBatchPart(m):
			if !by[i].Covers(m) {
				if err := s.Verify(ctx, s.Names.RoutingEventsStream(), m); err != nil {
					errs[i] = refusedIntent(fmt.Sprintf("routing batch part %d on %s", m.Seq, m.Subject), err)
					return
				}
			}
			parts[i], errs[i] = s.decodePart(m)
		case by[i].Covers(m):
			errs[i] = s.decodeEvent(m, &events[i])
		default:
			errs[i] = s.VerifyEvent(ctx, m, &events[i])
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(work/16, 1), len(msgs))
	if workers <= 1 {
		for i := range msgs {
			one(i)
		}
		return events, parts, errs
	}
	// Messages are taken one at a time, not in fixed strides: a batch's
	// parts each hold hundreds of events, single events one.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(msgs); i = int(next.Add(1) - 1) {
				one(i)
			}
		}()
	}
	wg.Wait()
	return events, parts, errs
}

// sealedMsgs returns the messages that append batch right after sequence
// last, each signed by k for the sequence it gets there: a seal first when
// the batch holds more than one event, then the events. ids are their
// message IDs.
func (s *Store) sealedMsgs(k *signing.Key, last uint64, batch []routingMsg) (msgs []*nats.Msg, ids []string, err error) {
	sealed := len(batch) > 1
	first := last + 1 // the first event's sequence
	if sealed {
		first++
	}
	msgs = make([]*nats.Msg, 0, len(batch)+1)
	ids = make([]string, 0, len(batch)+1)
	if sealed {
		msgs, ids = append(msgs, nil), append(ids, nuid.Next())
	}
	rs := RoutingSeal{Version: RecordVersion, First: first}
	for i, rm := range batch {
		sm := signing.Message{Subject: rm.subject, Seq: first + uint64(i), Body: rm.data}
		m := nats.NewMsg(rm.subject)
		m.Data = rm.data
		m.Header.Set(signing.Header, k.Sign(sm))
		if rm.parts > 0 {
			m.Header.Set(BatchPartsHeader, strconv.Itoa(rm.parts))
		}
		msgs, ids = append(msgs, m), append(ids, rm.id)
		if sealed {
			d := sm.Digest()
			rs.Digests = append(rs.Digests, d[:])
		}
	}
	if sealed {
		data, err := json.Marshal(&rs)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding routing seal: %w", err)
		}
		subj := s.Names.RoutingSealSubject()
		m := nats.NewMsg(subj)
		m.Data = data
		m.Header.Set(signing.Header, k.Sign(signing.Message{Subject: subj, Seq: last + 1, Body: data}))
		// A seal's ID is never a duplicate: one made again for a retry
		// covers other sequences.
		msgs[0] = m
	}
	return msgs, ids, nil
}

// SignRouting returns what PublishRouting appends for events right after
// sequence last, signed by k: sealed batches of up to SealMax events. It is
// for whoever publishes them itself (benchmarks timing the readers' side).
func (s *Store) SignRouting(k *signing.Key, last uint64, events []RoutingEvent) ([]*nats.Msg, error) {
	rms, err := s.encodeRouting("", events)
	if err != nil {
		return nil, err
	}
	var out []*nats.Msg
	for len(rms) > 0 {
		n := min(len(rms), SealMax)
		msgs, _, err := s.sealedMsgs(k, last+uint64(len(out)), rms[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, msgs...)
		rms = rms[n:]
	}
	return out, nil
}

// routingMsg is a routing event encoded for its subject.
type routingMsg struct {
	subject string
	data    []byte
	id      string
	// parts is the part count of the batch it is a part of (0: none).
	parts int
}

// publishSealed appends batch to the routing stream, preceded by a seal
// covering it when it holds more than one event, all pipelined: one round
// trip for the batch instead of one per event. Each message expects the
// sequence before it, so a racing appender makes the rest of the batch
// fail; publishSealed then returns how many events landed (their
// sequences in seqs) and no error, and the caller seals what is left
// afresh. Message IDs make a retried batch's landed events duplicates;
// dup says the last event answered was one (a retry of what landed
// before), after which sealing the rest would file a seal per event. The
// stream's head is read under headCtx, the batch sent under ctx.
func (s *Store) publishSealed(headCtx, ctx context.Context, key func() (*signing.Key, error), batch []routingMsg, seqs []uint64) (landed int, dup bool, err error) {
	stream := s.Names.RoutingEventsStream()
	k, err := key()
	if err != nil {
		return 0, false, &Error{Code: CodeSigningKeyRequired, Message: err.Error()}
	}
	last, err := s.lastSeq(headCtx, stream)
	if err != nil {
		return 0, false, err
	}
	msgs, ids, err := s.sealedMsgs(k, last, batch)
	if err != nil {
		return 0, false, err
	}
	sealed := len(msgs) > len(batch)
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	var sendErr error
	for i, m := range msgs {
		opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequence(last + uint64(i))}
		if ids[i] != "" {
			opts = append(opts, jetstream.WithMsgID(ids[i]))
		}
		if i > 0 {
			// Each append also names the one before it: the sequence
			// alone let an append land after another appender's message
			// that took the place of its failed predecessor, out of
			// order and outside its seal.
			opts = append(opts, jetstream.WithExpectLastMsgID(ids[i-1]))
		}
		f, err := s.JS.PublishMsgAsync(m, opts...)
		if err != nil {
			sendErr = err // what was sent is still answered below
			break
		}
		futures = append(futures, f)
	}
	// A stream without a leader answers nothing: the wait is bounded as
	// one attempt of a write that rides out an election is (ride bounds
	// ctx so only in a cluster).
	wctx, cancel := context.WithTimeout(ctx, electionAttempt)
	defer cancel()
	events := 0 // events answered so far, landed or duplicate
	for i, f := range futures {
		var ack *jetstream.PubAck
		select {
		case ack = <-f.Ok():
		case err = <-f.Err():
		case <-wctx.Done():
			err = wctx.Err()
		}
		if err != nil {
			s.forgetLastSeq(stream)
			if IsWrongLastSequence(err) || isWrongLastMsgID(err) {
				return events, dup, nil
			}
			return events, dup, err
		}
		if !ack.Duplicate {
			s.noteLastSeq(stream, ack.Sequence)
		}
		if sealed && i == 0 {
			continue
		}
		seqs[events] = ack.Sequence
		dup = ack.Duplicate
		events++
	}
	if sendErr != nil {
		s.forgetLastSeq(stream)
		return events, dup, sendErr
	}
	return events, dup, nil
}

// jsErrCodeWrongLastMsgID is nats-server's JSStreamWrongLastMsgIDErrF: an
// append whose Nats-Expected-Last-Msg-Id is not the stream's last.
const jsErrCodeWrongLastMsgID jetstream.ErrorCode = 10070

func isWrongLastMsgID(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeWrongLastMsgID
}
