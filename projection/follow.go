package projection

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// A projection that falls behind the republished routing events reads
// ahead instead of dropping them. They are delivered to a callback that
// hands them to the session, blocking while the session applies a run:
// what arrives meanwhile waits in the subscription's own pending list,
// sized for bursts of whole batches, where a fixed channel (ChanSubscribe)
// drops what does not fit ("slow consumer") and leaves the projection to
// find the hole and read it again with direct gets. The session then takes
// everything already delivered as one run, applied in one view swap.

// followPendingBytes bounds what may wait in the subscription: some 60
// batches of 10,000 services of ten instances. Past it NATS drops (counted
// in Status.Dropped) and the catch-up reads what was dropped.
const followPendingBytes = 1 << 30

// batchWait is how long a run that ends inside a routing batch waits for
// the batch's next part before it is applied without it.
const batchWait = 100 * time.Millisecond

// follower is a session's subscription to the republished routing events.
type follower struct {
	sub  *nats.Subscription
	c    chan *nats.Msg
	done chan struct{}
	seen uint64 // drops already counted (newDrops)
}

// follow subscribes to subject; stop ends it.
func follow(nc *nats.Conn, subject string) (*follower, error) {
	f := &follower{c: make(chan *nats.Msg, maxBatch), done: make(chan struct{})}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		select {
		case f.c <- m:
		case <-f.done:
		}
	})
	if err != nil {
		return nil, err
	}
	// No bound on the count: a run of single events is small, and the
	// bytes bound is what protects the process.
	if err := sub.SetPendingLimits(-1, followPendingBytes); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	f.sub = sub
	return f, nil
}

// stop releases a delivery blocked on the session, then unsubscribes.
func (f *follower) stop() {
	close(f.done)
	_ = f.sub.Unsubscribe()
}

// newDrops is how many messages NATS dropped for this subscription since
// the last call.
func (f *follower) newDrops() uint64 {
	n, _ := f.sub.Dropped()
	total := uint64(max(n, 0))
	d := total - min(f.seen, total)
	f.seen = total
	return d
}

// run appends first and every message already delivered after it to
// batch, up to maxBatch, as stored messages (bad is told of one that is
// not). A run that ends inside a routing batch (its last message a part
// before the last, by the part count header: a hint, nothing more) waits
// up to batchWait for each next part, so the batch is applied in one swap.
func (f *follower) run(ctx context.Context, first *nats.Msg, batch []*store.StoredMsg, bad func(uint64, string, error)) []*store.StoredMsg {
	var wait *time.Timer
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for next := first; next != nil; {
		sm, err := store.StoredFromMsg(next)
		if err != nil {
			bad(0, next.Subject, err)
		} else {
			batch = append(batch, sm)
		}
		// A seal is followed by what it covers, a batch part by the
		// rest of its batch: worth a short wait to apply them together.
		midBatch := err == nil && (partsLeft(sm) || strings.HasSuffix(sm.Subject, ".routing.seal"))
		next = nil
		if len(batch) == maxBatch {
			break
		}
		select {
		case next = <-f.c:
			continue
		default:
		}
		if !midBatch {
			break
		}
		if wait == nil {
			wait = time.NewTimer(batchWait)
		} else {
			wait.Reset(batchWait)
		}
		select {
		case next = <-f.c:
		case <-wait.C:
		case <-ctx.Done():
		}
	}
	return batch
}

// partsLeft says whether m is a batch part its batch has parts after.
func partsLeft(m *store.StoredMsg) bool {
	h := m.Header.Get(store.BatchPartsHeader)
	if h == "" {
		return false
	}
	n, err := strconv.Atoi(h)
	if err != nil {
		return false
	}
	i := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	part, err := strconv.Atoi(i)
	return err == nil && part+1 < n
}

// noteDropped counts n more routing events NATS dropped before the
// session read them.
func (p *Projection) noteDropped(n uint64) {
	if n > 0 {
		total := p.dropped.Add(n)
		p.log.Warn("routing events dropped by a slow subscription; reading them from the stream", zap.Uint64("dropped", n), zap.Uint64("total", total))
	}
}

// applyBatch verifies and applies events past the applied sequence and
// swaps in the resulting view. With live (events as the stream republished
// them, each naming the sequence before it) a batch that does not continue
// from the applied sequence is errGap; what continues is applied first. An
// event whose signature does not verify is refused, and one that cannot be
// decoded or applied is skipped: either way its service keeps its previous
// state. A signer that could not be looked up stops the batch there (errGap:
// it is read again).
func (p *Projection) applyBatch(ctx context.Context, st *store.Store, batch []*store.StoredMsg, created time.Time, live bool) error {
	cur := p.View()
	seq := cur.Seq
	var gap error
	take := make([]*store.StoredMsg, 0, len(batch))
	last := seq
	for _, m := range batch {
		if m.Seq <= last {
			continue
		}
		if live && m.Prev != last {
			gap = fmt.Errorf("%w: event %d follows %d, applied %d", errGap, m.Seq, m.Prev, last)
			break
		}
		take = append(take, m)
		last = m.Seq
	}
	if len(take) == 0 {
		return gap
	}
	events, parts, errs := p.verifyEvents(ctx, st, take)
	b := newBuilder(cur)
	var head uint64
	var lastTS time.Time
	var lastMsg *store.StoredMsg
	n, nEvents := 0, 0 // messages taken, and the events among them
	for i, m := range take {
		err := errs[i]
		if err != nil && !store.HasCode(err, store.CodeBadSignature) && !store.HasCode(err, store.CodeInvalid) {
			// Not a verdict (a signer could not be looked up): this
			// event and what follows are read again.
			gap = fmt.Errorf("%w: checking event %d: %v", errGap, m.Seq, err)
			break
		}
		switch {
		case st.IsSeal(m):
			// A seal changes no state: a refused one vouches for
			// nothing, and its batch is verified event by event.
			if err != nil {
				p.log.Warn("routing seal refused; its events are verified one by one", zap.Uint64("seq", m.Seq), zap.Error(err))
			}
		case err == nil && parts[i] != nil:
			// A batch part: all its events land in this one swap.
			for j := range parts[i].Events {
				if err := b.apply(&parts[i].Events[j]); err != nil {
					p.badEvent(m.Seq, m.Subject, err)
				}
			}
			nEvents += len(parts[i].Events) - 1
		case err == nil:
			if err := b.apply(&events[i]); err != nil {
				p.badEvent(m.Seq, m.Subject, err)
			}
		case store.HasCode(err, store.CodeBadSignature):
			p.refuse(m.Seq, m.Subject, err)
		default:
			p.badEvent(m.Seq, m.Subject, err)
		}
		if !st.IsSeal(m) {
			nEvents++
		}
		seq, lastMsg = m.Seq, m
		head = max(head, m.Seq+m.Pending)
		lastTS = m.Time
		n++
	}
	if n == 0 {
		return gap
	}
	// The mark is the last message's only: hashing each (a batch part is
	// up to BatchPartBytes) would cost what no reader looks at.
	p.mark = markOf(lastMsg.Seq, lastMsg.Subject, lastMsg.Data)
	v := b.finish(seq, !p.connected.Load())
	p.refuseEndpoints(b.refused)
	v.StreamCreated = created
	p.swap(v)
	p.eventsApplied.Add(uint64(nEvents))
	p.lastEventTime.Store(lastTS.UnixNano())
	p.noteHead(max(head, p.head.Load()), seq)
	p.kick()
	return gap
}

// verifyEvents checks and decodes events; without verification (tests'
// unsigned baseline) it only decodes them.
func (p *Projection) verifyEvents(ctx context.Context, st *store.Store, msgs []*store.StoredMsg) ([]store.RoutingEvent, []*store.RoutingBatchPart, []error) {
	if !p.skipVerify {
		return st.VerifyRouting(ctx, msgs, &p.seal)
	}
	events, parts, errs := make([]store.RoutingEvent, len(msgs)), make([]*store.RoutingBatchPart, len(msgs)), make([]error, len(msgs))
	for i, m := range msgs {
		var err error
		switch {
		case st.IsSeal(m):
			continue
		case st.IsBatchPart(m):
			parts[i] = new(store.RoutingBatchPart)
			err = store.Decode("routing batch part", m.Data, parts[i])
		default:
			err = store.Decode("routing event", m.Data, &events[i])
		}
		if err != nil {
			errs[i] = &store.Error{Code: store.CodeInvalid, Message: err.Error()}
		}
	}
	return events, parts, errs
}
