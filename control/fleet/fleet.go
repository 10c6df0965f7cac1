// Package fleet keeps the fleet at a glance: per namespace, how many
// instances are ready, starting, in backoff, failed, or on a machine whose
// heartbeat went stale, per deploy and per machine, with the last error
// each machine reported. An Aggregator in `control server` follows the
// instance records, the agents' instance observations and machine
// heartbeats with KV watches (their initial values rebuild it at start),
// marks the namespaces that changed, and writes their summaries at a
// bounded rate (a dirty set flushed every half second by default) to the
// fleet status bucket, which `control status` and `control deploy status`
// read. A summary that would say what the stored one says is not written
// (they are synced writes) until its revisions are ten flushes old; after
// each flush the aggregator says on a core NATS subject through which
// revisions every summary is current (flush.go).
//
// Two of its outputs are decisions others act on:
//   - the machine liveness judgement (liveness.go): which machines stopped
//     beating, written to cp_machine_liveness_<auth> on change and every
//     store.LivenessRefresh; gateways set those machines' instances aside
//     by it, and never read the beats themselves;
//   - each service's traffic figures, summed from the gateways' reports
//     (traffic.go; their layer-4 connections: l4.go), which `control
//     status`, the dashboard and the metrics show;
//   - which processes are heard from and at which schema generation
//     (processes.go), by which a control server raises the store's floor
//     and `control fleet versions` lists them.
//
// One control server writes at a time, holding the fleet status lease
// (elected.go); read.go holds what other parts read back, metrics.go the
// Prometheus collector.
package fleet

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// DefaultFlushEvery is how often changed summaries are written unless
// told otherwise: half a second keeps the lag a reader sees (up to one interval, plus the write) within a second.
const DefaultFlushEvery = 500 * time.Millisecond

// Config tunes an Aggregator.
type Config struct {
	// FlushEvery bounds how often a namespace's summary is written;
	// default DefaultFlushEvery.
	FlushEvery time.Duration
	// LeaseTTL is RunElected's lease; default DefaultLeaseTTL.
	LeaseTTL time.Duration
	Logger   *zap.Logger
}

// Aggregator follows the store and writes namespace summaries.
type Aggregator struct {
	s   *store.Store
	cfg Config
	log *zap.Logger

	// mu guards every field below it but leading (an atomic): the watches
	// (Run's loop), the flush, the liveness judgement and the metrics
	// collector all take it, each for a short, I/O-free section; a flush
	// computes its summaries under it and writes them after releasing it,
	// from a goroutine of Run's while the loop goes on taking in entries.
	mu sync.Mutex
	// byNS holds the instance records by namespace and KV key, so that a
	// namespace's summary costs its own instances, not the fleet's.
	byNS map[string]map[string]*store.InstanceRecord
	// onMachine counts each machine's instances by namespace, so that a
	// machine going stale marks only its namespaces dirty.
	onMachine map[string]map[string]int
	beats     map[string]store.MachineBeat
	// heard is when each machine's last beat was heard (beat).
	heard map[string]time.Time
	// live is each machine's liveness at the last look, to notice it
	// change with time alone.
	live map[string]string
	// observed holds each machine's instance observations, applied to
	// its instances' records when a summary is computed.
	observed map[string]*store.MachineObserved
	// rev and obsRev are the last instance record and observation
	// revisions taken in.
	rev, obsRev uint64
	dirty       map[string]time.Time // namespace → its oldest unflushed change
	// flushed is what was last written of each namespace (flush.go),
	// for metrics and to leave unchanged summaries unwritten.
	flushed map[string]store.NamespaceStatus
	// behind are the namespaces whose stored summary says what they are
	// but was left unwritten, so its revisions are older than the
	// aggregator's: it is written again once refreshEvery old.
	behind map[string]bool
	// told are the revisions the last FleetStatusFlushed said.
	told store.FleetStatusFlushed
	// lastLag is the time from the oldest change in the last flush to
	// that flush.
	lastLag time.Duration
	// leading is set while RunElected holds the lease.
	leading atomic.Bool
	// traffic holds each gateway's last reports, by gateway key.
	traffic map[string]*gatewayReports
	// judged is the liveness judgement last written, and when.
	judged   map[string]store.MachineDown
	judgedAt time.Time
}

// New returns an Aggregator over s writing to the fleet status bucket.
func New(s *store.Store, cfg Config) (*Aggregator, error) {
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Aggregator{s: s, cfg: cfg, log: cfg.Logger,
		byNS: map[string]map[string]*store.InstanceRecord{}, onMachine: map[string]map[string]int{},
		observed: map[string]*store.MachineObserved{}, beats: map[string]store.MachineBeat{}, heard: map[string]time.Time{}, live: map[string]string{},
		dirty: map[string]time.Time{}, flushed: map[string]store.NamespaceStatus{}, behind: map[string]bool{},
		traffic: map[string]*gatewayReports{}}, nil
}

// Run follows the store until ctx ends or a watch fails. Run again after
// a failure, it rebuilds what it holds from the store: the watches'
// initial values are the store as it is now, so nothing changed or
// deleted while it was away is missed.
func (a *Aggregator) Run(ctx context.Context) error {
	a.reset()
	iw, err := a.s.WatchInstances(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching instance records: %w", err))
	}
	defer func() { _ = iw.Stop() }()
	ow, err := a.s.WatchObserved(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching instance observations: %w", err))
	}
	defer func() { _ = ow.Stop() }()
	bw, err := a.s.WatchMachineBeats(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching machine heartbeats: %w", err))
	}
	defer func() { _ = bw.Stop() }()
	tw, err := a.s.WatchGatewayTraffic(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching gateway traffic: %w", err))
	}
	defer func() { _ = tw.Stop() }()
	t := time.NewTicker(a.cfg.FlushEvery)
	defer t.Stop()
	// A flush writes in a goroutine of its own (its synced writes take a
	// busy storage node hundreds of milliseconds), so that the watches
	// are taken in meanwhile and the next flush, due or overdue, has
	// them: writing ends with its result, nil while no flush is under
	// way, and a tick that meets one starts the next as soon as it ends
	// (overdue). Never two at once: a namespace's writes stay in order.
	var writing chan error
	overdue := false
	startFlush := func() {
		f := a.prepareFlush()
		done := make(chan error, 1)
		writing = done
		go func() { done <- a.flush(ctx, f) }()
	}
	defer func() {
		if writing != nil {
			<-writing
		}
	}()
	// Nothing is written until the watches have delivered the store as
	// it is: a summary of half the records would be a wrong one.
	var instancesLoaded, observedLoaded, beatsLoaded bool
	ended := func(what string) error {
		if ctx.Err() != nil {
			return nil
		}
		return store.Errorf(store.CodeUnavailable, "%s watch ended", what)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ent, ok := <-iw.Updates():
			if !ok {
				return ended("instance record")
			}
			if ent == nil {
				instancesLoaded = true
			} else {
				a.instance(ent)
			}
		case ent, ok := <-ow.Updates():
			if !ok {
				return ended("instance observation")
			}
			if ent == nil {
				observedLoaded = true
			} else {
				a.observation(ent)
			}
		case ent, ok := <-bw.Updates():
			if !ok {
				return ended("heartbeat")
			}
			if ent == nil {
				beatsLoaded = true
			} else {
				a.beat(ent, beatsLoaded)
			}
		case ent, ok := <-tw.Updates():
			if !ok {
				return ended("gateway traffic")
			}
			if ent != nil {
				a.trafficReport(ent)
			}
		case <-t.C:
			if !instancesLoaded || !observedLoaded || !beatsLoaded {
				continue
			}
			a.ageBeats()
			a.ageTraffic()
			if err := a.judge(ctx, time.Now()); err != nil && ctx.Err() == nil {
				a.log.Warn("writing machine liveness", zap.Error(err))
			}
			if writing != nil {
				overdue = true
				continue
			}
			startFlush()
		case err := <-writing:
			writing = nil
			if err != nil && ctx.Err() == nil {
				a.log.Warn("writing fleet status", zap.Error(err))
			}
			if overdue {
				overdue = false
				startFlush()
			}
		}
	}
}

// reset forgets what the aggregator holds, marking every namespace it
// knew dirty so that one gone meanwhile has its summary deleted.
func (a *Aggregator) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for ns := range a.byNS {
		a.touch(ns, now)
	}
	for ns := range a.flushed {
		a.touch(ns, now)
	}
	clear(a.byNS)
	clear(a.onMachine)
	clear(a.observed)
	clear(a.beats)
	clear(a.heard)
	clear(a.live)
	clear(a.traffic)
	a.judged = nil // written again once the watches delivered the store
}
func (a *Aggregator) touch(ns string, at time.Time) {
	if _, ok := a.dirty[ns]; !ok {
		a.dirty[ns] = at
	}
}
func (a *Aggregator) instance(ent jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	key := ent.Key()
	a.rev = max(a.rev, ent.Revision())
	// The key starts with the namespace (store.InstanceKey), and a
	// record whose body disagrees with its key is never taken in.
	ns, _, _ := strings.Cut(key, ".")
	if old, ok := a.byNS[ns][key]; ok {
		a.forget(ns, key, old.Machine)
		a.touch(ns, now)
	}
	var rec store.InstanceRecord
	if ent.Operation() != jetstream.KeyValuePut || store.DecodeKeyed(a.s.Names.InstancesBucket(), key, ent.Value(), &rec) != nil {
		return
	}
	insts := a.byNS[rec.Namespace]
	if insts == nil {
		insts = map[string]*store.InstanceRecord{}
		a.byNS[rec.Namespace] = insts
	}
	insts[key] = &rec
	m := a.onMachine[rec.Machine]
	if m == nil {
		m = map[string]int{}
		a.onMachine[rec.Machine] = m
	}
	m[rec.Namespace]++
	a.touch(rec.Namespace, now)
}

// forget drops the record under key; a.mu is held.
func (a *Aggregator) forget(ns, key, machine string) {
	if insts := a.byNS[ns]; insts != nil {
		delete(insts, key)
		if len(insts) == 0 {
			delete(a.byNS, ns)
		}
	}
	if m := a.onMachine[machine]; m != nil {
		if m[ns]--; m[ns] <= 0 {
			delete(m, ns)
		}
		if len(m) == 0 {
			delete(a.onMachine, machine)
		}
	}
}

// observation takes in a machine's instance observations, which change the
// summaries of the namespaces it runs instances of.
func (a *Aggregator) observation(ent jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.obsRev = max(a.obsRev, ent.Revision())
	m := ent.Key()
	old := a.observed[m]
	delete(a.observed, m)
	var o store.MachineObserved
	if ent.Operation() == jetstream.KeyValuePut && store.DecodeKeyed(a.s.Names.ObservedBucket(), m, ent.Value(), &o) == nil {
		a.observed[m] = &o
		// Agents write their observations again unchanged every minute
		// (control/agent's RewriteEvery), so that one a power cut took
		// does not stand: that changes no summary, and marking its
		// namespaces would rewrite their (synced) summaries each time.
		if old != nil && sameObservations(old.Instances, o.Instances) {
			return
		}
	}
	now := time.Now()
	for ns := range a.onMachine[m] {
		a.touch(ns, now)
	}
}

// sameObservations says whether a and b observe the same of every
// instance.
func sameObservations(a, b map[string]store.ObservedInstance) bool {
	return maps.EqualFunc(a, b, func(x, y store.ObservedInstance) bool {
		if !x.LastExitAt.Equal(y.LastExitAt) || !x.NextRestart.Equal(y.NextRestart) || !x.UpdatedAt.Equal(y.UpdatedAt) {
			return false
		}
		x.LastExitAt, x.NextRestart, x.UpdatedAt = y.LastExitAt, y.NextRestart, y.UpdatedAt
		return x == y
	})
}

// summary computes ns's summary from what the aggregator holds; a.mu is
// held.
func (a *Aggregator) summary(ns string) store.NamespaceStatus {
	st := store.NamespaceStatus{Version: store.RecordVersion, Namespace: ns, Deploys: map[string]store.Counts{}, Machines: map[string]store.Counts{},
		LastErrors: map[string]string{}, Revision: a.rev, Observed: a.obsRev, UpdatedAt: time.Now().UTC()}
	lastErrAt := map[string]time.Time{}
	for _, stored := range a.byNS[ns] {
		rec := *stored
		a.observed[rec.Machine].Apply(&rec)
		stale := isStale(a.live[rec.Machine])
		st.Counts.Add(rec.State, stale)
		d := st.Deploys[rec.DeployID]
		d.Add(rec.State, stale)
		st.Deploys[rec.DeployID] = d
		m := st.Machines[rec.Machine]
		m.Add(rec.State, stale)
		st.Machines[rec.Machine] = m
		if rec.Error != "" && rec.UpdatedAt.After(lastErrAt[rec.Machine]) {
			st.LastErrors[rec.Machine], lastErrAt[rec.Machine] = rec.ID+": "+rec.Error, rec.UpdatedAt
		}
	}
	st.Traffic, st.SetAside = a.trafficOf(ns), a.setAsideOf(ns)
	if len(st.Machines) > maxMachinesListed {
		for m, c := range st.Machines {
			if c.Ready == c.Total() {
				delete(st.Machines, m)
			}
		}
		st.MachinesTrimmed = true
	}
	return st
}

// maxMachinesListed bounds the per-machine counts one summary carries in
// full.
const maxMachinesListed = 500
