package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
)

// Place gives the fleet namespaces deployments of perNS ready instances
// each, spread over the machines, written by each machine's own agent as
// an apply would leave them. It stands in for a thousand applies when what
// is measured is what follows them.
func (f *Fleet) Place(ctx context.Context, namespaces, perNS int) error {
	var recs []store.InstanceRecord
	now := time.Now().UTC()
	for n := range namespaces {
		ns := fmt.Sprintf("ns%04d", n)
		for i := range perNS {
			id := f.IDs[(n*perNS+i)%len(f.IDs)]
			recs = append(recs, store.InstanceRecord{Version: store.RecordVersion, ID: fmt.Sprintf("%s-web-%d", ns, i),
				Namespace: ns, Service: "web", Slot: i, Revision: 1, DeployID: ns + "-r1", Machine: id, Address: f.cfg.Address,
				Port: 20000 + i, State: store.InstanceReady, Driver: "sim", CreatedAt: now, UpdatedAt: now})
		}
	}
	return parallel(ctx, recs, func(ctx context.Context, rec store.InstanceRecord) error {
		if _, err := f.agent(rec.Machine).PutInstance(ctx, &rec); err != nil {
			return err
		}
		f.mu.Lock()
		f.insts[rec.Machine][rec.ID] = rec
		f.placed = append(f.placed, [2]string{rec.Machine, rec.ID})
		f.mu.Unlock()
		return nil
	})
}

// Write is one acknowledged instance state change of a churn.
type Write struct {
	Namespace string
	// Revision is the observation write that holds it.
	Revision uint64
	// At is when the write was sent.
	At time.Time
}

// ChurnResult says what a churn did.
type ChurnResult struct {
	Writes int
	// Stored counts the observation writes the store took for them: fewer
	// than Writes where an agent wrote changes together.
	Stored int
	// Summaries and Beats count the fleet status and heartbeat writes
	// the store took meanwhile: the rest of what the storage node's CPU
	// per change pays for.
	Summaries, Beats int
	// Retries counts writes sent again after an error (a storage node
	// going away mid-write): the write is only counted once acknowledged.
	Retries int
	// Behind counts writes that could not start on time: the store did
	// not keep up with the rate asked for.
	Behind  int
	Elapsed time.Duration
	// Stall is the longest time no write was acknowledged, and StallAt
	// when it began (since the writes began): what a storage node's
	// death costs while its streams elect new leaders.
	Stall, StallAt time.Duration
}

// Rate is the writes per second achieved.
func (r ChurnResult) Rate() float64 { return float64(r.Writes) / r.Elapsed.Seconds() }

// churnStates are what a churning instance moves between, as healing and
// applies move real ones.
var churnStates = []store.InstanceState{store.InstanceReady, store.InstanceReady, store.InstanceStarting, store.InstanceBackoff, store.InstanceFailed}

// Churn changes the state of random instances Place placed at rate changes
// per second for d, each through its machine's agent, calling onWrite with
// every acknowledged change. With burst above 1, the changes come up to
// burst at a time to instances of one machine, as an apply's or a
// machine-wide restart's do; their agent writes them together when they
// meet. A write that fails is sent again until it is acknowledged (or ctx
// ends), so that the last acknowledged state of every instance is what the
// store must hold (see Verify).
func (f *Fleet) Churn(ctx context.Context, rate int, d time.Duration, burst int, onWrite func(Write)) (ChurnResult, error) {
	f.mu.Lock()
	keys := slices.Clone(f.placed)
	f.mu.Unlock()
	if len(keys) == 0 {
		return ChurnResult{}, errors.New("churn: no instances placed")
	}
	onMachine := map[string][]int{}
	for k, key := range keys {
		onMachine[key[0]] = append(onMachine[key[0]], k)
	}
	firstSeq, err := f.writeSeqs(ctx)
	if err != nil {
		return ChurnResult{}, err
	}
	// One lock per instance keeps its writes in order: the last
	// acknowledged is the last sent.
	locks := make([]sync.Mutex, len(keys))
	var res ChurnResult
	var writes, retries, behind atomic.Int64
	var firstErr atomic.Pointer[error]
	const workers = 128
	work := make(chan int, workers)
	var wg sync.WaitGroup
	start := time.Now()
	var ackMu sync.Mutex
	lastAck := start
	acked := func() {
		now := time.Now()
		ackMu.Lock()
		defer ackMu.Unlock()
		if gap := now.Sub(lastAck); gap > res.Stall {
			res.Stall, res.StallAt = gap, lastAck.Sub(start)
		}
		lastAck = now
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for k := range work {
				m, id := keys[k][0], keys[k][1]
				locks[k].Lock()
				f.mu.Lock()
				rec := f.insts[m][id]
				f.mu.Unlock()
				rec.State, rec.Error = churnStates[r.IntN(len(churnStates))], ""
				if rec.State == store.InstanceFailed {
					rec.Error = "exited: exit status 1"
				}
				rec.UpdatedAt = time.Now().UTC()
				at := time.Now()
				f.mu.Lock()
				f.insts[m][id] = rec
				f.mu.Unlock()
				rev, n, err := f.put(ctx, m)
				retries.Add(int64(n))
				if err != nil {
					locks[k].Unlock()
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				locks[k].Unlock()
				writes.Add(1)
				acked()
				if onWrite != nil {
					onWrite(Write{Namespace: rec.Namespace, Revision: rev, At: at})
				}
			}
		}()
	}
	r := rand.New(rand.NewPCG(1, uint64(start.UnixNano())))
	t := time.NewTicker(5 * time.Millisecond)
	sent := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case now := <-t.C:
			el := now.Sub(start)
			if el >= d {
				break loop
			}
			due := int(el.Seconds() * float64(rate))
			for sent < due {
				k := r.IntN(len(keys))
				group := []int{k}
				if burst > 1 {
					group = onMachine[keys[k][0]]
					group = group[:min(len(group), burst, due-sent)]
				}
				for _, k := range group {
					sent++
					select {
					case work <- k:
					default:
						behind.Add(1)
					}
				}
			}
		}
	}
	t.Stop()
	close(work)
	wg.Wait()
	ackMu.Lock()
	defer ackMu.Unlock()
	res.Elapsed = time.Since(start)
	res.Writes, res.Retries, res.Behind = int(writes.Load()), int(retries.Load()), int(behind.Load())
	if e := firstErr.Load(); e != nil {
		return res, *e
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	lastSeq, err := f.writeSeqs(ctx)
	res.Stored, res.Summaries, res.Beats = int(lastSeq[0]-firstSeq[0]), int(lastSeq[1]-firstSeq[1]), int(lastSeq[2]-firstSeq[2])
	return res, err
}

// writeSeqs are the last sequences of the streams of the instance
// observations, the fleet status and the heartbeats: how many writes of
// each the store took.
func (f *Fleet) writeSeqs(ctx context.Context) ([3]uint64, error) {
	var out [3]uint64
	for i, bucket := range []string{f.s.Names.ObservedBucket(), f.s.Names.FleetStatusBucket(), f.s.Names.MachineBeatsBucket()} {
		info, err := f.s.StreamInfo(ctx, "KV_"+bucket)
		if err != nil {
			return out, fmt.Errorf("reading the stream of %s: %w", bucket, err)
		}
		out[i] = info.State.LastSeq
	}
	return out, nil
}

// put writes machine's observations through its agent until acknowledged,
// for up to a minute: a storage node going away fails writes in flight
// until the client has moved to another.
func (f *Fleet) put(ctx context.Context, machine string) (rev uint64, retries int, err error) {
	deadline := time.Now().Add(time.Minute)
	for {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rev, err = f.observe(wctx, machine)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return rev, retries, err
		}
		retries++
		select {
		case <-ctx.Done():
			return 0, retries, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Verify checks the store against what the fleet's agents last had
// acknowledged: every instance record holds its last acknowledged state
// (no update lost), and no other record exists.
func (f *Fleet) Verify(ctx context.Context) error {
	want := map[string]store.InstanceRecord{}
	f.mu.Lock()
	for _, insts := range f.insts {
		for _, r := range insts {
			want[r.Key()] = r
		}
	}
	f.mu.Unlock()
	var problems []string
	seen := 0
	err := f.s.ListInstances(ctx, ">", func(key string, r *store.InstanceRecord) error {
		w, ok := want[key]
		switch {
		case !ok:
			problems = append(problems, key+" is in the store but no agent runs it")
		case r.State != w.State || !r.UpdatedAt.Equal(w.UpdatedAt):
			problems = append(problems, fmt.Sprintf("%s: store has %s of %s, last acknowledged %s of %s", key,
				r.State, r.UpdatedAt.Format(time.RFC3339Nano), w.State, w.UpdatedAt.Format(time.RFC3339Nano)))
		}
		seen++
		return nil
	})
	if err != nil {
		return err
	}
	if seen != len(want) {
		problems = append(problems, fmt.Sprintf("%d records in the store, %d acknowledged", seen, len(want)))
	}
	if len(problems) > 0 {
		if len(problems) > 10 {
			problems = append(problems[:10], fmt.Sprintf("and %d more", len(problems)-10))
		}
		return fmt.Errorf("lost updates: %v", problems)
	}
	return nil
}

// VerifySummaries checks that the fleet status summaries equal a recount
// from the store, waiting up to wait for the aggregator to catch up.
func VerifySummaries(ctx context.Context, s *store.Store, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		diff, err := summaryDiff(ctx, s)
		if err != nil || diff == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("summaries differ from a recount after %s: %s", wait, diff)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func summaryDiff(ctx context.Context, s *store.Store) (string, error) {
	want, err := fleet.Recount(ctx, s, time.Now())
	if err != nil {
		return "", err
	}
	sums, err := fleet.Read(ctx, s)
	if err != nil {
		return "", err
	}
	diff := fleet.Differences(sums, want)
	if len(diff) > 5 {
		diff = append(diff[:5], fmt.Sprintf("and %d more", len(diff)-5))
	}
	if len(diff) == 0 {
		return "", nil
	}
	return fmt.Sprint(diff), nil
}

// LagMeter measures the fleet status lag: from an instance observation
// write being sent to the aggregator saying its namespace's summary counts
// it: the first summary written with its Observed revision at or past the
// write's, or the first flush notice (store.FleetStatusFlushed) past it,
// which covers a write that changed nothing the summary says (such a
// summary is not rewritten), whichever is seen first.
type LagMeter struct {
	mu      sync.Mutex
	pending map[string][]Write
	// seen are the latest summaries seen of each namespace, for a write
	// noted after the summary that counts it arrived; told the latest
	// flush notice.
	seen map[string][]seenSummary
	told seenSummary
	lags []lagSample
	stop func()
}

type lagSample struct {
	sent time.Time
	lag  time.Duration
}

type seenSummary struct {
	rev uint64
	at  time.Time
}

// NewLagMeter follows the summaries in s until Stop.
func NewLagMeter(ctx context.Context, s *store.Store) (*LagMeter, error) {
	m := &LagMeter{pending: map[string][]Write{}, seen: map[string][]seenSummary{}}
	unfollow, err := s.FollowFleetStatusFlushed(func(f *store.FleetStatusFlushed) { m.flushed(f.Observed, time.Now()) })
	if err != nil {
		return nil, err
	}
	w, err := s.WatchNamespaceStatus(ctx, jetstream.UpdatesOnly())
	if err != nil {
		unfollow()
		return nil, fmt.Errorf("watching fleet status: %w", err)
	}
	done := make(chan struct{})
	m.stop = func() { _ = w.Stop(); <-done; unfollow() }
	go func() {
		defer close(done)
		for ent := range w.Updates() {
			if ent == nil || ent.Operation() != jetstream.KeyValuePut {
				continue
			}
			var st store.NamespaceStatus
			if store.DecodeKeyed(s.Names.FleetStatusBucket(), ent.Key(), ent.Value(), &st) != nil {
				continue
			}
			m.summary(st.Namespace, st.Observed, time.Now())
		}
	}()
	return m, nil
}

// Wrote notes a write to be matched.
func (m *LagMeter) Wrote(w Write) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.told.rev >= w.Revision {
		m.lags = append(m.lags, lagSample{w.At, m.told.at.Sub(w.At)})
		return
	}
	for _, s := range m.seen[w.Namespace] {
		if s.rev >= w.Revision {
			m.lags = append(m.lags, lagSample{w.At, s.at.Sub(w.At)})
			return
		}
	}
	m.pending[w.Namespace] = append(m.pending[w.Namespace], w)
}

func (m *LagMeter) summary(ns string, rev uint64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending[ns] = m.counted(m.pending[ns], rev, at)
	seen := append(m.seen[ns], seenSummary{rev, at})
	m.seen[ns] = seen[max(0, len(seen)-16):]
}

// flushed takes a flush notice: every namespace's summary counts the
// observation writes up to rev.
func (m *LagMeter) flushed(rev uint64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev <= m.told.rev {
		return
	}
	m.told = seenSummary{rev, at}
	for ns, p := range m.pending {
		if p = m.counted(p, rev, at); len(p) == 0 {
			delete(m.pending, ns)
		} else {
			m.pending[ns] = p
		}
	}
}

// counted records the lags of the writes in p up to rev, counted at at,
// and returns the others; m.mu is held.
func (m *LagMeter) counted(p []Write, rev uint64, at time.Time) []Write {
	keep := p[:0]
	for _, w := range p {
		if w.Revision <= rev {
			m.lags = append(m.lags, lagSample{w.At, at.Sub(w.At)})
		} else {
			keep = append(keep, w)
		}
	}
	return keep
}

// Stop ends the watch.
func (m *LagMeter) Stop() { m.stop() }

// Lags are the measured lags of the writes sent in [from, to) (zero
// times: unbounded), sorted, and how many writes no summary has counted
// yet.
func (m *LagMeter) Lags(from, to time.Time) (lags []time.Duration, unseen int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pending {
		unseen += len(p)
	}
	for _, s := range m.lags {
		if (from.IsZero() || !s.sent.Before(from)) && (to.IsZero() || s.sent.Before(to)) {
			lags = append(lags, s.lag)
		}
	}
	slices.Sort(lags)
	return lags, unseen
}

// Percentile is the p-th percentile (0-100) of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}
