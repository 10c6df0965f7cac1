package projection

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// errUncertain says the projection can no longer prove it saw every routing
// event since its view's sequence: the caller rebuilds from stored state.
var errUncertain = errors.New("routing projection freshness is uncertain")

func uncertain(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUncertain, fmt.Sprintf(format, args...))
}

// maxBatch bounds how many queued events one View swap absorbs, so a burst
// costs one copy of the touched shards instead of one per event.
const maxBatch = 512

// delivered is a message tagged with the consumer generation that got it, so
// messages of a stopped consumer are told apart from the current one's.
type delivered struct {
	gen int
	msg jetstream.Msg
}

// session loads the view from the store, then applies routing events until
// freshness becomes uncertain (errUncertain), the store fails, or ctx ends.
func (p *Projection) session(ctx context.Context, st *store.Store) error {
	nc := st.NC
	reconnects := nc.Stats().Reconnects

	created, err := p.load(ctx, st)
	if err != nil {
		return err
	}

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan delivered, 1024)
	// restart carries the generation of a consumer the server dropped
	// (deleted, heartbeats lost); the loop recreates it from our position.
	restart := make(chan int, 1)
	gen := 0
	var cc jetstream.ConsumeContext
	// startConsumer (re)creates an ephemeral, unacknowledged consumer from
	// the applied sequence + 1: an ordered consumer whose resets we make
	// ourselves, so every message after one is checked for continuity.
	startConsumer := func() error {
		if cc != nil {
			cc.Stop() // non-blocking; the server drops it after InactiveThreshold
			cc = nil
		}
		gen++
		g := gen
		from := p.View().Seq + 1
		cctx, ccancel := context.WithTimeout(sctx, 5*time.Second)
		defer ccancel()
		cons, err := st.JS.CreateConsumer(cctx, st.Names.RoutingEventsStream(), jetstream.ConsumerConfig{
			Description:       "routing projection of gateway " + p.cfg.Name,
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       from,
			AckPolicy:         jetstream.AckNonePolicy,
			InactiveThreshold: 30 * time.Second,
			MemoryStorage:     true,
			Replicas:          1,
		})
		if err != nil {
			return store.Classify(fmt.Errorf("creating routing consumer from sequence %d: %w", from, err))
		}
		c, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- delivered{gen: g, msg: m}:
			case <-sctx.Done():
			}
		}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if c := p.log.Check(zap.DebugLevel, "routing consumer"); c != nil {
				c.Write(zap.Error(err))
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
				errors.Is(err, jetstream.ErrNoHeartbeat) {
				select {
				case restart <- g:
				default:
				}
			}
		}))
		if err != nil {
			return store.Classify(fmt.Errorf("consuming routing events from sequence %d: %w", from, err))
		}
		cc = c
		return nil
	}
	// A consumer that cannot start (NATS went away right after the load)
	// is retried from the loop; the loaded view stays.
	needVerify := false
	if err := startConsumer(); err != nil {
		p.setError(err.Error())
		needVerify = true
	}
	defer func() {
		if cc != nil {
			cc.Stop()
		}
	}()

	connTick := time.NewTicker(100 * time.Millisecond)
	defer connTick.Stop()
	infoTick := time.NewTicker(p.cfg.ReportInterval)
	defer infoTick.Stop()
	batch := make([]jetstream.Msg, 0, maxBatch)

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()

		case <-connTick.C:
			if nc.IsClosed() {
				return errors.New("the NATS connection was closed")
			}
			if nc.Status() != nats.CONNECTED {
				if p.connected.Swap(false) {
					p.logDown("lost NATS; serving the last good routing view", nil)
					p.swap(p.View().withStale(true))
				}
				continue
			}
			if r := nc.Stats().Reconnects; r != reconnects || needVerify {
				// A reconnect is continuous only if the stream is the same
				// one and still holds everything after our position.
				if err := p.verify(ctx, st, created); err != nil {
					if errors.Is(err, errUncertain) {
						return err
					}
					p.setError(err.Error())
					needVerify = true
					continue
				}
				reconnects, needVerify = r, false
				if err := startConsumer(); err != nil {
					needVerify = true
					p.setError(err.Error())
					continue
				}
				p.log.Info("NATS reconnected; routing stream continuous, resuming", zap.Uint64("seq", p.View().Seq))
			}
			if !p.connected.Load() || p.View().Stale {
				p.markConnected()
				p.setError("")
				p.swap(p.View().withStale(false))
			}

		case g := <-restart:
			if g == gen {
				needVerify = true
			}

		case <-infoTick.C:
			if nc.Status() != nats.CONNECTED {
				continue
			}
			if err := p.verify(ctx, st, created); err != nil {
				if errors.Is(err, errUncertain) {
					return err
				}
				p.log.Debug("polling routing stream", zap.Error(err))
			}

		case d := <-msgs:
			if d.gen != gen {
				continue
			}
			batch = append(batch[:0], d.msg)
		drain:
			for len(batch) < maxBatch {
				select {
				case d := <-msgs:
					if d.gen == gen {
						batch = append(batch, d.msg)
					}
				default:
					break drain
				}
			}
			if nc.Stats().Reconnects != reconnects {
				// Verify the reconnect before applying anything more; the
				// consumer restarts from our position afterwards.
				needVerify = true
				continue
			}
			if err := p.applyBatch(batch, created); err != nil {
				return err
			}
		}
	}
}

// load builds a complete view from stored state and swaps it in. It returns
// the routing stream's creation time, the stream's identity.
func (p *Projection) load(ctx context.Context, st *store.Store) (time.Time, error) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	info, err := st.Routing.Info(lctx)
	if err != nil {
		return time.Time{}, store.Classify(fmt.Errorf("loading routing state: %w", err))
	}
	rs, err := st.LoadRouting(lctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("loading routing state: %w", err)
	}
	b := newBuilder(emptyView(false))
	for i := range rs.Services {
		if err := b.apply(&rs.Services[i]); err != nil {
			p.badEvents.Add(1)
			p.log.Error("skipping unusable stored routing state", zap.String("identity", rs.Services[i].Identity()), zap.Error(err))
		}
	}
	for _, m := range rs.Machines {
		b.upsertMachine(m)
	}
	v := b.finish(rs.Seq, false)
	v.BuiltAt = time.Now()
	v.StreamCreated = info.Created
	old := p.View()
	n := p.loads.Add(1)
	p.markConnected()
	p.setError("")
	p.noteHead(info.State.LastSeq, v.Seq)
	p.swap(v)
	p.kick()
	p.log.Info("routing projection loaded from the store",
		zap.Uint64("seq", v.Seq), zap.Uint64("previous_seq", old.Seq), zap.Bool("rebuild", n > 1),
		zap.Int("services", v.numServices), zap.Int("routable_instances", v.numEndpoints),
		zap.Int("machines", v.numMachines), zap.Duration("took", time.Since(start)))
	return info.Created, nil
}

// verify checks that the routing stream is the one we loaded from and still
// holds every event after our position. A mismatch is errUncertain; failing
// to ask is an ordinary error.
func (p *Projection) verify(ctx context.Context, st *store.Store, created time.Time) error {
	vctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := st.Routing.Info(vctx)
	if err != nil {
		return store.Classify(fmt.Errorf("reading routing stream info: %w", err))
	}
	applied := p.View().Seq
	switch {
	case !info.Created.Equal(created):
		return uncertain("routing stream was recreated (created %s, loaded from one created %s)", info.Created, created)
	case info.State.LastSeq < applied:
		return uncertain("routing stream ends at %d, before the applied sequence %d", info.State.LastSeq, applied)
	case info.State.FirstSeq > applied+1:
		return uncertain("routing stream starts at %d, past the applied sequence %d: events were lost", info.State.FirstSeq, applied)
	}
	p.noteHead(info.State.LastSeq, applied)
	return nil
}

// applyBatch applies consecutive events and swaps in the resulting view. A
// sequence gap is errUncertain; an event that cannot be decoded or applied
// is counted, reported and skipped, leaving that identity as it was.
func (p *Projection) applyBatch(batch []jetstream.Msg, created time.Time) error {
	cur := p.View()
	b := newBuilder(cur)
	applied := cur.Seq
	var head uint64
	var lastTS time.Time
	n := 0
	for _, m := range batch {
		meta, err := m.Metadata()
		if err != nil {
			return uncertain("routing message without metadata: %v", err)
		}
		seq := meta.Sequence.Stream
		if seq <= applied {
			continue
		}
		if seq != applied+1 {
			return uncertain("routing sequence gap: expected %d, got %d", applied+1, seq)
		}
		var ev store.RoutingEvent
		if err := store.Decode("routing event", m.Data(), &ev); err != nil {
			p.badEvent(seq, m.Subject(), err)
		} else if err := b.apply(&ev); err != nil {
			p.badEvent(seq, m.Subject(), err)
		}
		applied = seq
		head = seq + meta.NumPending
		lastTS = meta.Timestamp
		n++
	}
	if n == 0 {
		return nil
	}
	v := b.finish(applied, !p.connected.Load())
	v.StreamCreated = created
	p.swap(v)
	p.eventsApplied.Add(uint64(n))
	p.lastEventTime.Store(lastTS.UnixNano())
	p.noteHead(head, applied)
	p.kick()
	return nil
}

func (p *Projection) badEvent(seq uint64, subject string, err error) {
	p.badEvents.Add(1)
	msg := fmt.Sprintf("skipping routing event %d on %s: %v", seq, subject, err)
	p.setError(msg)
	p.log.Error("skipping unusable routing event; the previous state of its service stays",
		zap.Uint64("seq", seq), zap.String("subject", subject), zap.Error(err))
}

// noteHead records the stream head and when the view fell behind it.
func (p *Projection) noteHead(head, applied uint64) {
	p.head.Store(head)
	if head > applied {
		p.behindSince.CompareAndSwap(0, time.Now().UnixNano())
	} else {
		p.behindSince.Store(0)
	}
}

// kick asks the reporter and the snapshot writer to look at the new view.
func (p *Projection) kick() {
	select {
	case p.reportKick <- struct{}{}:
	default:
	}
	select {
	case p.snapshotKick <- struct{}{}:
	default:
	}
}

// reportLoop publishes this gateway's observation after applies and every
// ReportInterval, while the store is reachable.
func (p *Projection) reportLoop(ctx context.Context) {
	if p.cfg.Name == "" {
		return
	}
	t := time.NewTicker(p.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.reportKick:
		}
		st := p.cur.Load()
		if st == nil || !p.connected.Load() || p.loads.Load() == 0 {
			continue
		}
		v := p.View()
		obs := store.GatewayObservation{Version: store.RecordVersion, Gateway: p.cfg.Name,
			AppliedSeq: v.Seq, Stale: v.Stale, At: time.Now().UTC()}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := store.PutJSON(pctx, st.Gateways, GatewayKey(p.cfg.Name), &obs)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Debug("publishing gateway observation", zap.Error(err))
		}
	}
}

// GatewayKey is the key of gateway name's observation in the gateways bucket.
func GatewayKey(name string) string { return store.KeySafe(name) }

// snapshotLoop writes the view to SnapshotPath after changes, at most once
// per SnapshotInterval, and once more when ctx ends.
func (p *Projection) snapshotLoop(ctx context.Context) {
	if p.cfg.SnapshotPath == "" {
		return
	}
	var written *View
	write := func() {
		v := p.View()
		if p.loads.Load() == 0 || (written != nil && written.Seq == v.Seq && written.BuiltAt.Equal(v.BuiltAt)) {
			return
		}
		if err := writeSnapshot(p.cfg.SnapshotPath, v); err != nil {
			msg := err.Error()
			p.snapshotErr.Store(&msg)
			p.log.Error("writing routing snapshot", zap.Error(err))
			return
		}
		p.snapshotErr.Store(nil)
		written = v
	}
	for {
		select {
		case <-ctx.Done():
			write()
			return
		case <-p.snapshotKick:
		}
		write()
		t := time.NewTimer(p.cfg.SnapshotInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			write()
			return
		case <-t.C:
		}
	}
}
