// Package fleet keeps the fleet at a glance: per namespace, how many
// instances are ready, starting, in backoff, failed, or on a machine whose
// heartbeat went stale, per deploy and per machine, with the last error
// each machine reported. An Aggregator in `control server` follows the
// instance records and machine heartbeats with KV watches (their initial
// values rebuild it at start), marks the namespaces that changed, and
// writes their summaries at a bounded rate (seed 003: a dirty set flushed
// at 1 Hz) to the fleet status bucket, which `control status` and `control
// deploy status` read.
package fleet

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Config tunes an Aggregator.
type Config struct {
	// FlushEvery bounds how often a namespace's summary is written;
	// default 1s.
	FlushEvery time.Duration
	Logger     *zap.Logger
}

// Aggregator follows the store and writes namespace summaries.
type Aggregator struct {
	s   *store.Store
	kv  jetstream.KeyValue
	cfg Config
	log *zap.Logger

	mu    sync.Mutex
	insts map[string]store.InstanceRecord // by KV key
	beats map[string]store.MachineBeat
	// live is each machine's liveness at the last look, to notice it
	// change with time alone.
	live  map[string]string
	dirty map[string]bool
	// flushed is what was last written, for metrics.
	flushed map[string]store.NamespaceStatus
	// lag is the time from the oldest unflushed change to its flush, last
	// time.
	lastLag time.Duration
	since   map[string]time.Time
}

// New returns an Aggregator over s writing to the fleet status bucket.
func New(s *store.Store, cfg Config) (*Aggregator, error) {
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Aggregator{s: s, kv: s.FleetStatus, cfg: cfg, log: cfg.Logger,
		insts: map[string]store.InstanceRecord{}, beats: map[string]store.MachineBeat{}, live: map[string]string{},
		dirty: map[string]bool{}, flushed: map[string]store.NamespaceStatus{}, since: map[string]time.Time{}}, nil
}

// Run follows the store until ctx ends or a watch fails.
func (a *Aggregator) Run(ctx context.Context) error {
	iw, err := a.s.Instances.WatchAll(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching instance records: %w", err))
	}
	defer func() { _ = iw.Stop() }()
	bw, err := a.s.MachineBeats.WatchAll(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("watching machine heartbeats: %w", err))
	}
	defer func() { _ = bw.Stop() }()
	t := time.NewTicker(a.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ent, ok := <-iw.Updates():
			if !ok {
				return store.Errorf(store.CodeUnavailable, "instance record watch ended")
			}
			if ent != nil {
				a.instance(ent)
			}
		case ent, ok := <-bw.Updates():
			if !ok {
				return store.Errorf(store.CodeUnavailable, "heartbeat watch ended")
			}
			if ent != nil {
				a.beat(ent)
			}
		case <-t.C:
			a.ageBeats()
			if err := a.flush(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("writing fleet status", zap.Error(err))
			}
		}
	}
}

func (a *Aggregator) touch(ns string) {
	a.dirty[ns] = true
	if _, ok := a.since[ns]; !ok {
		a.since[ns] = time.Now()
	}
}

func (a *Aggregator) instance(ent jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := ent.Key()
	if old, ok := a.insts[key]; ok {
		a.touch(old.Namespace)
	}
	var rec store.InstanceRecord
	if ent.Operation() != jetstream.KeyValuePut || store.DecodeKeyed(a.s.Instances.Bucket(), key, ent.Value(), &rec) != nil {
		delete(a.insts, key)
		return
	}
	a.insts[key] = rec
	a.touch(rec.Namespace)
}

func (a *Aggregator) beat(ent jetstream.KeyValueEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b store.MachineBeat
	if ent.Operation() != jetstream.KeyValuePut || store.DecodeKeyed(a.s.MachineBeats.Bucket(), ent.Key(), ent.Value(), &b) != nil {
		delete(a.beats, ent.Key())
	} else {
		a.beats[b.Machine] = b
	}
	a.machineChanged(ent.Key())
}

// ageBeats notices machines whose liveness changed with time alone.
func (a *Aggregator) ageBeats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for m := range a.beats {
		a.machineChanged(m)
	}
}

// machineChanged marks the namespaces with instances on m dirty if m's
// liveness changed; a.mu is held.
func (a *Aggregator) machineChanged(m string) {
	var now string
	if b, ok := a.beats[m]; ok {
		now = b.Liveness(time.Now())
	} else {
		now = store.MachineNeverSeen
	}
	if a.live[m] == now {
		return
	}
	a.live[m] = now
	for _, rec := range a.insts {
		if rec.Machine == m {
			a.touch(rec.Namespace)
		}
	}
}

// stale says whether instances on m count as stale; a machine that never
// beat (an older agent) is taken at its records' word.
func (a *Aggregator) stale(m string) bool {
	l := a.live[m]
	return l == store.MachineStale || l == store.MachineOffline
}

// Summary computes ns's summary from what the aggregator holds.
func (a *Aggregator) summary(ns string) store.NamespaceStatus {
	st := store.NamespaceStatus{Version: store.RecordVersion, Namespace: ns, Deploys: map[string]store.Counts{}, Machines: map[string]store.Counts{},
		LastErrors: map[string]string{}, UpdatedAt: time.Now().UTC()}
	lastErrAt := map[string]time.Time{}
	for _, rec := range a.insts {
		if rec.Namespace != ns {
			continue
		}
		stale := a.stale(rec.Machine)
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

// flush writes the summaries of the namespaces that changed.
func (a *Aggregator) flush(ctx context.Context) error {
	a.mu.Lock()
	var out []store.NamespaceStatus
	var oldest time.Time
	for _, ns := range slices.Sorted(maps.Keys(a.dirty)) {
		out = append(out, a.summary(ns))
		if t := a.since[ns]; oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	a.dirty, a.since = map[string]bool{}, map[string]time.Time{}
	a.mu.Unlock()
	var errs []string
	for i := range out {
		st := &out[i]
		var err error
		if st.Counts.Total() == 0 {
			err = a.kv.Delete(ctx, st.Namespace)
			if err == jetstream.ErrKeyNotFound {
				err = nil
			}
		} else {
			_, err = store.PutJSON(ctx, a.kv, st.Namespace, st)
		}
		if err != nil {
			errs = append(errs, err.Error())
			a.mu.Lock()
			a.touch(st.Namespace) // written next time
			a.mu.Unlock()
			continue
		}
		a.mu.Lock()
		if st.Counts.Total() == 0 {
			delete(a.flushed, st.Namespace)
		} else {
			a.flushed[st.Namespace] = *st
		}
		a.mu.Unlock()
	}
	if !oldest.IsZero() {
		a.mu.Lock()
		a.lastLag = time.Since(oldest)
		a.mu.Unlock()
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// Read returns every namespace summary in the store, by namespace.
func Read(ctx context.Context, s *store.Store) (map[string]store.NamespaceStatus, error) {
	out := map[string]store.NamespaceStatus{}
	err := store.ListJSON(ctx, s, s.FleetStatus, ">", func(_ string, st *store.NamespaceStatus) error {
		out[st.Namespace] = *st
		return nil
	})
	return out, err
}

var (
	instancesDesc = prometheus.NewDesc("edgeplane_fleet_instances", "Instances per namespace and state, as last flushed (stale: on a machine whose heartbeat is stale or offline).",
		[]string{"namespace", "state"}, nil)
	lagDesc = prometheus.NewDesc("edgeplane_fleet_status_lag_seconds", "From the oldest change in the last flush to that flush.", nil, nil)
)

// Describe implements prometheus.Collector.
func (a *Aggregator) Describe(ch chan<- *prometheus.Desc) {
	ch <- instancesDesc
	ch <- lagDesc
}

// Collect implements prometheus.Collector.
func (a *Aggregator) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ns, st := range a.flushed {
		c := st.Counts
		for state, n := range map[string]int{"ready": c.Ready, "starting": c.Starting, "backoff": c.Backoff, "failed": c.Failed,
			"draining": c.Draining, "stopped": c.Stopped, "stale": c.Stale} {
			ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(n), ns, state)
		}
	}
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, a.lastLag.Seconds())
}
