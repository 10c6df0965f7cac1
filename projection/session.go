package projection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// errUncertain says the projection can no longer prove it saw every routing
// event since its view's sequence: the caller rebuilds from stored state.
var errUncertain = errors.New("routing projection freshness is uncertain")

func uncertain(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUncertain, fmt.Sprintf(format, args...))
}

// maxBatch bounds how many events one View swap absorbs, so a burst costs
// one copy of the touched shards instead of one per event.
const maxBatch = 512

// errGap is a batch that does not start right after the applied sequence.
var errGap = errors.New("routing sequence gap")

// session loads the view from the store, then applies routing events until
// freshness becomes uncertain (errUncertain), the store fails, or ctx ends.
//
// It creates no consumer: it reads the events the routing stream republishes
// once stored (each with its stream sequence), and reads what it missed,
// after a reconnect or a gap, with direct gets from its applied sequence.
func (p *Projection) session(ctx context.Context, st *store.Store) error {
	nc := st.NC
	reconnects := nc.Stats().Reconnects

	// Subscribe before loading, so that no event falls between the load
	// and the first republished one.
	fol, err := follow(nc, st.Names.RoutingRepublishedWildcard())
	if err != nil {
		return store.Classify(fmt.Errorf("following routing events: %w", err))
	}
	defer fol.stop()
	republished := fol.c
	// Signer certificates as they change: a retired signer stops
	// verifying at once, a new one is known before its first event.
	signers := make(chan *nats.Msg, 64)
	ssub, err := nc.ChanSubscribe(st.Names.SignersRepublishedWildcard(), signers)
	if err != nil {
		return store.Classify(fmt.Errorf("following signers: %w", err))
	}
	defer func() { _ = ssub.Unsubscribe() }()
	// The control plane's judgement of machine liveness, to set aside
	// the instances of a machine that stopped beating (liveness.go).
	judged := make(chan *nats.Msg, 16)
	lsub, err := nc.ChanSubscribe(st.Names.MachineLivenessRepublishedWildcard(), judged)
	if err != nil {
		return store.Classify(fmt.Errorf("following machine liveness: %w", err))
	}
	defer func() { _ = lsub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return store.Classify(fmt.Errorf("following routing events: %w", err))
	}

	created, err := p.load(ctx, st)
	if err != nil {
		return err
	}
	if err := p.loadLiveness(ctx, st); err != nil {
		// Liveness then starts from the next judgement republished.
		p.log.Warn("reading machine liveness", zap.Error(err))
	}
	liveTick := time.NewTicker(livenessCheck)
	defer liveTick.Stop()

	connTick := time.NewTicker(100 * time.Millisecond)
	defer connTick.Stop()
	infoTick := time.NewTicker(p.cfg.ReportInterval)
	defer infoTick.Stop()
	batch := make([]*store.StoredMsg, 0, maxBatch)
	needCatchUp, needVerify := true, false

	for {
		// Nothing is read from a stream not yet proven the one followed
		// (a reconnect, or a verify that failed): it may have been
		// rewound.
		if needCatchUp && !needVerify && nc.IsConnected() && nc.Stats().Reconnects == reconnects {
			switch err := p.catchUp(ctx, st, created); {
			case errors.Is(err, errUncertain):
				return err
			case err != nil:
				p.setError(err.Error())
			default:
				needCatchUp = false
			}
		}
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
					p.update(func(v *View) *View { return v.withStale(true) })
				}
				// Cut off, this process hears no judgement: it sets no
				// machine aside, and reads the latest once reconnected.
				p.setDown(nil)
				// A reconnect refused at the TLS handshake (the server
				// did not prove itself) is worth saying.
				if err := store.TLSFailure(nc); err != nil {
					p.setError(err.Error())
					p.logDown("NATS reconnect refused; serving the last good routing view", err)
				}
				continue
			}
			if r := nc.Stats().Reconnects; r != reconnects || needVerify {
				// A reconnect is continuous only if the stream is the same
				// one, still holds everything after our position, and was
				// not rewound under it.
				if err := p.verify(ctx, st, created, true); err != nil {
					if errors.Is(err, errUncertain) {
						return err
					}
					p.setError(err.Error())
					needVerify = true
					continue
				}
				if r != reconnects {
					p.log.Info("NATS reconnected; routing stream continuous, resuming", zap.Uint64("seq", p.View().Seq))
					if err := p.loadLiveness(ctx, st); err != nil {
						p.log.Warn("reading machine liveness", zap.Error(err))
					}
				}
				reconnects, needVerify, needCatchUp = r, false, true
			}
			if !p.connected.Load() || p.View().Stale {
				p.markConnected()
				p.setError("")
				p.update(func(v *View) *View { return v.withStale(false) })
			}

		case <-infoTick.C:
			if nc.Status() != nats.CONNECTED {
				continue
			}
			if err := p.verify(ctx, st, created, false); err != nil {
				if errors.Is(err, errUncertain) {
					return err
				}
				p.log.Debug("polling routing stream", zap.Error(err))
				continue
			}
			// A republished event lost on the way shows as a head past
			// the applied sequence: read it.
			if p.head.Load() > p.View().Seq {
				needCatchUp = true
			}

		case <-liveTick.C:
			if nc.Status() == nats.CONNECTED {
				p.judgeLiveness()
			}

		case m := <-judged:
			if sm, err := store.StoredFromMsg(m); err == nil {
				p.liveness(st, sm)
			}

		case m := <-signers:
			if sm, err := store.StoredFromMsg(m); err == nil {
				if err := st.ApplySignerMsg(ctx, sm); err != nil {
					p.log.Warn("signer certificate refused", zap.Error(err))
				}
			}

		case m := <-republished:
			batch = fol.run(ctx, m, batch[:0], p.badEvent)
			p.noteDropped(fol.newDrops())
			if nc.Stats().Reconnects != reconnects {
				// Verify the reconnect before applying anything more; the
				// catch-up reads from our position afterwards.
				needVerify = true
				continue
			}
			switch err := p.applyBatch(ctx, st, batch, created, true); {
			case errors.Is(err, errGap):
				needCatchUp = true // read what the republishing lost
			case err != nil:
				return err
			}
		}
	}
}

// catchUp reads and applies every event after the applied sequence. The
// stream keeps the last events of every subject, so what it no longer holds
// past our position was replaced by a later event of the same subject,
// which this reads: no hole in the sequence is a loss.
func (p *Projection) catchUp(ctx context.Context, st *store.Store, created time.Time) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	batch := make([]*store.StoredMsg, 0, maxBatch)
	flush := func() error {
		err := p.applyBatch(cctx, st, batch, created, false)
		batch = batch[:0]
		return err
	}
	_, err := st.ReadFrom(cctx, st.Names.RoutingEventsStream(), p.View().Seq+1, "", func(m *store.StoredMsg) error {
		batch = append(batch, m)
		if len(batch) == maxBatch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// load builds a complete view from stored state and swaps it in. It returns
// the routing stream's creation time, the stream's identity.
func (p *Projection) load(ctx context.Context, st *store.Store) (time.Time, error) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	info, err := st.RoutingInfo(lctx)
	if err != nil {
		return time.Time{}, store.Classify(fmt.Errorf("loading routing state: %w", err))
	}
	rs, err := st.LoadRouting(lctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("loading routing state: %w", err)
	}
	for _, why := range rs.Skipped[len(rs.Refused):] {
		p.log.Warn("skipping a stored record the routing state cannot use", zap.String("reason", why))
	}
	old := p.View()
	// A seal vouches for events right after it: none follows a load.
	p.seal = nil
	b := newBuilder(emptyView(false))
	// A subject whose last event does not verify keeps what this gateway
	// served for it (its last good state), if anything.
	for _, r := range rs.Refused {
		p.refuse(r.Seq, r.Subject, r.Err)
		if region, ok := st.Names.RoutingRegionOf(r.Subject); ok {
			if rr, ok := old.RegionRecord(region); ok {
				b.upsertRegion(rr)
			}
			continue
		}
		if ns, svc, ok := st.Names.RoutingMaintenanceOf(r.Subject); ok {
			if mr, ok := old.maintenance[maintenanceKey{ns, svc}]; ok {
				b.upsertMaintenance(mr)
			}
			continue
		}
		if ns, _, ok := st.Names.RoutingBatchOf(r.Subject); ok {
			// Which of the namespace's services the refused part held
			// is unknown: each keeps what it had, unless the load has
			// a good state for it (applied over these below).
			for _, svc := range old.Services() {
				if svc.Namespace == ns {
					b.upsertService(svc.event())
				}
			}
			continue
		}
		ns, name, ok := st.Names.RoutingSubjectOf(r.Subject)
		switch {
		case !ok:
		case ns == "":
			if m, ok := old.Machine(name); ok {
				b.upsertMachine(m)
			}
		default:
			if svc, ok := old.Service(ns, name); ok {
				b.upsertService(svc.event())
			}
		}
	}
	for i := range rs.Services {
		if err := b.apply(&rs.Services[i]); err != nil {
			p.badEvents.Add(1)
			p.log.Error("skipping unusable stored routing state", zap.String("identity", rs.Services[i].Identity()), zap.Error(err))
		}
	}
	for _, m := range rs.Machines {
		b.upsertMachine(m)
	}
	for _, r := range rs.Regions {
		b.upsertRegion(r)
	}
	for _, m := range rs.Maintenance {
		b.upsertMaintenance(m)
	}
	p.markStreamHead(lctx, st, rs.Seq)
	// A snapshot (or the view before a rebuild) further along the same
	// stream than the store: the store went back in time. The store is
	// the truth; say so once per rebuild.
	if old.Seq > rs.Seq && !old.StreamCreated.IsZero() && !p.rewindNoted {
		p.noteRewind(fmt.Errorf("%w: the store's routing ends at %d, this gateway served %d (stream created %s, the store's %s)",
			errRewound, rs.Seq, old.Seq, old.StreamCreated, info.Created))
	}
	p.rewindNoted = false
	v := b.finish(rs.Seq, false)
	p.refuseEndpoints(b.refused)
	v.BuiltAt = time.Now()
	v.StreamCreated = info.Created
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
// holds every event after our position; with mark, that the message last
// applied is still the one at our position (rewind.go). A mismatch is
// errUncertain (errRewound); failing to ask is an ordinary error.
func (p *Projection) verify(ctx context.Context, st *store.Store, created time.Time, mark bool) error {
	vctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := st.RoutingInfo(vctx)
	if err != nil {
		return store.Classify(fmt.Errorf("reading routing stream info: %w", err))
	}
	applied := p.View().Seq
	switch {
	case !info.Created.Equal(created):
		return rewound("routing stream was recreated (created %s, loaded from one created %s)", info.Created, created)
	case info.State.LastSeq < applied:
		return rewound("routing stream ends at %d, before the applied sequence %d", info.State.LastSeq, applied)
	}
	if mark {
		if err := p.checkMark(ctx, st); err != nil {
			return err
		}
	}
	p.noteHead(info.State.LastSeq, applied)
	return nil
}

// refuse counts and reports an event whose signature did not verify; its
// service or machine keeps its last good state.
func (p *Projection) refuse(seq uint64, subject string, err error) {
	p.rejected.Add(1)
	msg := fmt.Sprintf("refused routing event %d on %s: %v", seq, subject, err)
	p.lastRejection.Store(&msg)
	p.setError(msg)
	p.log.Error("refusing a routing event whose signature does not verify; its service keeps its last good state",
		zap.Uint64("seq", seq), zap.String("subject", subject), zap.Error(err))
}

// maxLoggedRefusals bounds the endpoint refusals logged one by one per
// batch or load; the rest are counted, and summed up in one line.
const maxLoggedRefusals = 8

// refuseEndpoints counts and reports endpoints a view sets aside because
// their machine's record does not admit them: they are never dialled, and
// the rest of their service is served.
func (p *Projection) refuseEndpoints(errs []error) {
	if len(errs) == 0 {
		return
	}
	p.endpointsRefused.Add(uint64(len(errs)))
	msg := errs[len(errs)-1].Error()
	p.lastEndpointRefusal.Store(&msg)
	for i, err := range errs {
		if i == maxLoggedRefusals {
			p.log.Error("refusing more endpoints their machines' records do not admit", zap.Int("more", len(errs)-i))
			break
		}
		p.log.Error("refusing an endpoint its machine's record does not admit; it is not dialled", zap.Error(err))
	}
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

// Report asks for the gateway's observation to be written again soon (its
// layer-4 drains or port errors changed).
func (p *Projection) Report() {
	select {
	case p.reportKick <- struct{}{}:
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
			AppliedSeq: v.Seq, Stale: v.Stale, At: time.Now().UTC(), Digest: v.Digest(), Hosts: len(v.Hosts())}
		if p.cfg.Region != nil {
			obs.Region = p.cfg.Region()
		}
		if p.cfg.Layer4 != nil {
			obs.L4Draining, obs.L4Errors = p.cfg.Layer4(v)
		}
		obs.Conflicts = reportedConflicts(v)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.PutGatewayObservation(pctx, &obs)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Debug("publishing gateway observation", zap.Error(err))
		}
	}
}

// trafficLoop writes the gateway's traffic counters every TrafficInterval
// while the store is reachable. A report that could not be written is
// not retried: the next one carries its counts.
func (p *Projection) trafficLoop(ctx context.Context) {
	if p.cfg.Name == "" || p.cfg.Traffic == nil {
		return
	}
	t := time.NewTicker(p.cfg.TrafficInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := p.cur.Load()
		if st == nil || !p.connected.Load() {
			continue
		}
		since, services, aside := p.cfg.Traffic()
		if len(services) == 0 && len(aside) == 0 {
			continue
		}
		rep := store.GatewayTraffic{Gateway: p.cfg.Name, Since: since, At: time.Now().UTC(), Services: services, SetAside: aside}
		if p.cfg.Region != nil {
			rep.Region = p.cfg.Region()
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.PutGatewayTraffic(pctx, &rep)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Debug("publishing gateway traffic", zap.Error(err))
		}
	}
}

// maxReportedConflicts bounds the conflicts one observation names: the
// record must stay small.
const maxReportedConflicts = 8

// reportedConflicts are v's host conflicts, then its layer-4 ones
// ("tcp/5432: a/db over b/db"), at most maxReportedConflicts.
func reportedConflicts(v *View) []string {
	hosts, l4 := v.Conflicts(), v.Layer4().Conflicts()
	var out []string
	for i := range len(hosts) + len(l4) {
		if i == maxReportedConflicts {
			return append(out, fmt.Sprintf("and %d more", len(hosts)+len(l4)-i))
		}
		if i < len(hosts) {
			c := hosts[i]
			out = append(out, fmt.Sprintf("%s: %s over %s", c.Host, c.Owner, strings.Join(c.Others, ", ")))
		} else {
			c := l4[i-len(hosts)]
			out = append(out, fmt.Sprintf("%s: %s over %s", c.Entry, c.Owner, strings.Join(c.Others, ", ")))
		}
	}
	return out
}

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
