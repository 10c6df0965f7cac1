package fleet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func startAggregator(t *testing.T, s *store.Store) *fleet.Aggregator {
	t.Helper()
	a, err := fleet.New(s, fleet.Config{FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	})
	return a
}

// caughtUp waits until the summaries in the store equal want (a
// recount), and the one of namespace ns counts writes up to rev.
func caughtUp(t *testing.T, s *store.Store, ns string, rev uint64, want map[string]store.Counts) {
	t.Helper()
	var diff string
	deadline := time.Now().Add(10 * time.Second)
	for {
		sums, err := fleet.Read(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		diffs := fleet.Differences(sums, want)
		if sums[ns].Revision < rev {
			diffs = append(diffs, fmt.Sprintf("%s summarised through revision %d, written at %d", ns, sums[ns].Revision, rev))
		}
		diff = strings.Join(diffs, "; ")
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("summaries never caught up: %s", diff)
		}
		time.Sleep(20 * time.Millisecond) // polling the store, not synchronising
	}
}

func record(ns, machine, id string, state store.InstanceState) *store.InstanceRecord {
	now := time.Now().UTC()
	return &store.InstanceRecord{Version: store.RecordVersion, ID: id, Namespace: ns, Service: "web", Machine: machine,
		DeployID: ns + "-r1", State: state, Driver: "test", CreatedAt: now, UpdatedAt: now}
}

// Concurrent writers change instance states in many namespaces while the
// aggregator follows: once it has caught up, every summary equals a recount
// from the store, and a summary's revision says which writes it includes.
func TestSummariesEqualARecountAfterConcurrentWrites(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	a := startAggregator(t, s)

	const namespaces, machines, perNS, writers, writesEach = 20, 10, 15, 8, 300
	states := []store.InstanceState{store.InstanceReady, store.InstanceStarting, store.InstanceBackoff, store.InstanceFailed, store.InstanceDraining}
	var wg sync.WaitGroup
	sInstances := storetest.Bucket(t, s, s.Names.InstancesBucket())
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range writesEach {
				ns := fmt.Sprintf("ns%02d", r.IntN(namespaces))
				i := r.IntN(perNS)
				rec := record(ns, fmt.Sprintf("m%d", i%machines), fmt.Sprintf("%s-web-%d", ns, i), states[r.IntN(len(states))])
				var err error
				if r.IntN(10) == 0 {
					err = sInstances.Delete(ctx, rec.Key())
				} else {
					_, err = store.PutJSON(ctx, sInstances, rec.Key(), rec)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// A last write after all the others: a summary that includes it
	// includes them.
	rev, err := store.PutJSON(ctx, sInstances, "ns00.m0.ns00-web-0", record("ns00", "m0", "ns00-web-0", store.InstanceReady))
	if err != nil {
		t.Fatal(err)
	}
	want, err := fleet.Recount(ctx, s, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, s, "ns00", rev, want)
	if a.Pending() != 0 {
		t.Errorf("%d namespaces still pending", a.Pending())
	}
}

// Instances on a machine whose heartbeat went stale count as stale, not
// as what their records say; a record filed under another instance's key
// is not counted at all; a new aggregator rebuilds the same summaries
// from the store.
func TestStaleMachinesAndMisfiledRecords(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	sInstances := storetest.Bucket(t, s, s.Names.InstancesBucket())
	put := func(key string, rec *store.InstanceRecord) uint64 {
		t.Helper()
		rev, err := store.PutJSON(ctx, sInstances, key, rec)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	for i, m := range []string{"m1", "m1", "m2"} {
		rec := record("shop", m, fmt.Sprintf("shop-web-%d", i), store.InstanceReady)
		put(rec.Key(), rec)
	}
	// m2's agent wrote its last beat long ago; m1 beats.
	if err := s.PutMachineBeat(ctx, "m1", time.Minute); err != nil {
		t.Fatal(err)
	}
	old := &store.MachineBeat{Version: store.RecordVersion, Machine: "m2", At: time.Now().Add(-time.Hour), Interval: store.Duration(time.Second)}
	sMachineBeats := storetest.Bucket(t, s, s.Names.MachineBeatsBucket())
	if _, err := store.PutJSON(ctx, sMachineBeats, "m2", old); err != nil {
		t.Fatal(err)
	}
	// A record whose body names another namespace than its key.
	rev := put("shop.m1.shop-web-9", record("other", "m1", "shop-web-9", store.InstanceFailed))

	want := map[string]store.Counts{"shop": {Ready: 2, Stale: 1}}
	startAggregator(t, s)
	caughtUp(t, s, "shop", rev, want)
	// A second aggregator (another control server, or this one
	// restarted) rebuilds the same from the store.
	startAggregator(t, s)
	rev = put("shop.m1.shop-web-0", record("shop", "m1", "shop-web-0", store.InstanceStarting))
	caughtUp(t, s, "shop", rev, map[string]store.Counts{"shop": {Ready: 1, Starting: 1, Stale: 1}})
	got, err := fleet.Recount(ctx, s, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got["shop"] != (store.Counts{Ready: 1, Starting: 1, Stale: 1}) || len(got) != 1 {
		t.Fatalf("recount: %+v", got)
	}
}

// Two control servers: one writes the fleet status, the other stands by
// and takes over once the first stops; the summaries stay right across.
func TestOneWriterAmongControlServers(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	aggs := make([]*fleet.Aggregator, 2)
	cancels := make([]context.CancelFunc, 2)
	dones := make([]chan struct{}, 2)
	for i := range aggs {
		var err error
		if aggs[i], err = fleet.New(srv.Connect(t), fleet.Config{FlushEvery: 50 * time.Millisecond, LeaseTTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		var rctx context.Context
		rctx, cancels[i] = context.WithCancel(ctx)
		dones[i] = make(chan struct{})
		go func() {
			defer close(dones[i])
			aggs[i].RunElected(rctx, fmt.Sprintf("server-%d", i))
		}()
		t.Cleanup(func() { cancels[i](); <-dones[i] })
	}
	storetest.Eventually(t, 5*time.Second, "one writer", func() bool { return aggs[0].Writing() != aggs[1].Writing() })
	writer := 0
	if aggs[1].Writing() {
		writer = 1
	}
	rec := record("shop", "m1", "shop-web-0", store.InstanceReady)
	instances := storetest.Bucket(t, srv.Store, srv.Store.Names.InstancesBucket())
	rev, err := store.PutJSON(ctx, instances, rec.Key(), rec)
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, srv.Store, "shop", rev, map[string]store.Counts{"shop": {Ready: 1}})
	if aggs[1-writer].Writing() {
		t.Fatal("both write")
	}
	// The writer stops (its lease released); the other takes over.
	cancels[writer]()
	<-dones[writer]
	storetest.Eventually(t, 5*time.Second, "the standby to take over", func() bool { return aggs[1-writer].Writing() })
	rec.State = store.InstanceFailed
	if rev, err = store.PutJSON(ctx, instances, rec.Key(), rec); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, srv.Store, "shop", rev, map[string]store.Counts{"shop": {Failed: 1}})
}

// The aggregator judges machine liveness for the gateways: a machine that
// stops beating is listed, by the time the aggregator heard it last, not
// by its own clock; one beating again leaves the list; and the record is
// written again every store.LivenessRefresh even when nothing changed.
func TestLivenessJudgement(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := srv.Store
	const interval = 100 * time.Millisecond
	// m1's clock is an hour behind: its beats must still count as now.
	skewed := &store.MachineBeat{Version: store.RecordVersion, Machine: "m1", At: time.Now().Add(-time.Hour), Interval: store.Duration(interval)}
	sMachineBeats := storetest.Bucket(t, s, s.Names.MachineBeatsBucket())
	if _, err := store.PutJSON(ctx, sMachineBeats, "m1", skewed); err != nil {
		t.Fatal(err)
	}
	startAggregator(t, s)
	judged := func(what string, ok func(*store.LivenessRecord) bool) *store.LivenessRecord {
		t.Helper()
		var r *store.LivenessRecord
		storetest.Eventually(t, 10*time.Second, what, func() bool {
			var err error
			r, err = s.Liveness(ctx)
			return err == nil && r != nil && ok(r)
		})
		return r
	}
	// beatOn beats machine every half interval until the test ends.
	stop := make(chan struct{})
	var beating sync.WaitGroup
	defer func() { close(stop); beating.Wait() }()
	beatOn := func(beat func()) {
		beating.Add(1)
		go func() {
			defer beating.Done()
			for {
				beat()
				select {
				case <-stop:
					return
				case <-time.After(interval / 2):
				}
			}
		}()
	}
	// m1 beats on, with its skewed clock, while m2 beats once and stops.
	beatOn(func() {
		b := *skewed
		b.At = time.Now().Add(-time.Hour)
		_, _ = store.PutJSON(ctx, sMachineBeats, "m1", &b)
	})
	if err := s.PutMachineBeat(ctx, "m2", interval); err != nil {
		t.Fatal(err)
	}
	heard := time.Now()
	r := judged("m2 judged stale", func(r *store.LivenessRecord) bool { return r.Down["m2"].Liveness == store.MachineStale })
	if _, down := r.Down["m1"]; down {
		t.Fatalf("m1 beats (with a clock an hour behind) and is judged %+v", r.Down["m1"])
	}
	if d := r.Down["m2"]; d.Interval != interval || d.LastBeat.Before(heard.Add(-time.Second)) || d.LastBeat.After(time.Now()) {
		t.Fatalf("m2 judged %+v", d)
	}
	if err := s.PutMachineBeat(ctx, "m2", interval); err != nil {
		t.Fatal(err)
	}
	r = judged("m2 live again", func(r *store.LivenessRecord) bool { _, down := r.Down["m2"]; return !down })
	// Beating steadily from here, m2 keeps the list as it is: the record
	// is still written again within a refresh.
	beatOn(func() { _ = s.PutMachineBeat(ctx, "m2", interval) })
	first := r.At
	judged("the judgement refreshed", func(r *store.LivenessRecord) bool {
		return r.At.Sub(first) >= store.LivenessRefresh-time.Second && len(r.Down) == 0
	})
}

// An agent's instance observations count where they are newer than the
// instance records, and only for instances of the machine that wrote
// them; a summary's Observed revision says which observation writes it
// includes, and a later record (an apply's stop) counts over them.
func TestObservationsCount(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs := map[string]*store.InstanceRecord{}
	for i, m := range []string{"m1", "m1", "m2"} {
		rec := record("shop", m, fmt.Sprintf("shop-web-%d", i), store.InstanceStarting)
		if _, err := s.PutInstance(ctx, rec); err != nil {
			t.Fatal(err)
		}
		recs[rec.ID] = rec
	}
	startAggregator(t, s)
	later := time.Now().Add(time.Second).UTC()
	seen := map[string]store.ObservedInstance{
		"shop-web-0": {Namespace: "shop", State: store.InstanceReady, UpdatedAt: later},
		"shop-web-1": {Namespace: "shop", State: store.InstanceBackoff, UpdatedAt: later},
		// m2's instance: m1 cannot speak for it.
		"shop-web-2": {Namespace: "shop", State: store.InstanceFailed, UpdatedAt: later},
	}
	w := agent.NewObservedWriter(s, "m1", func() map[string]store.ObservedInstance { return seen })
	rev, err := w.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	summarised := func(want store.Counts, rev uint64) {
		t.Helper()
		storetest.Eventually(t, 10*time.Second, fmt.Sprintf("shop summarised as %+v", want), func() bool {
			sums, err := fleet.Read(ctx, s)
			return err == nil && sums["shop"].Counts == want && sums["shop"].Observed >= rev
		})
		got, err := fleet.Recount(ctx, s, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if got["shop"] != want {
			t.Fatalf("recount %+v, want %+v", got["shop"], want)
		}
	}
	summarised(store.Counts{Ready: 1, Backoff: 1, Starting: 1}, rev)
	// The apply stops shop-web-1: its record, newer, counts.
	stop := recs["shop-web-1"]
	stop.State, stop.UpdatedAt = store.InstanceStopped, later.Add(time.Second)
	if _, err := s.PutInstance(ctx, stop); err != nil {
		t.Fatal(err)
	}
	summarised(store.Counts{Ready: 1, Stopped: 1, Starting: 1}, rev)
}

// An agent writes its observations again unchanged every minute: that
// rewrites no summary (they are synced writes, one per namespace of the
// machine), while a change does.
func TestUnchangedObservationsRewriteNoSummary(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, rec := range []*store.InstanceRecord{record("shop", "m1", "shop-web-0", store.InstanceStarting),
		record("cafe", "m2", "cafe-web-0", store.InstanceStarting)} {
		if _, err := s.PutInstance(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	startAggregator(t, s)
	later := time.Now().Add(time.Second).UTC()
	writer := func(m, id string, state *store.InstanceState) *agent.ObservedWriter {
		return agent.NewObservedWriter(s, m, func() map[string]store.ObservedInstance {
			return map[string]store.ObservedInstance{id: {Namespace: strings.Split(id, "-")[0], State: *state, UpdatedAt: later}}
		})
	}
	shopState, cafeState := store.InstanceReady, store.InstanceReady
	shop, cafe := writer("m1", "shop-web-0", &shopState), writer("m2", "cafe-web-0", &cafeState)
	statusRev := func(ns string) uint64 {
		t.Helper()
		rev, err := store.GetJSON(ctx, storetest.Bucket(t, s, s.Names.FleetStatusBucket()), ns, &store.NamespaceStatus{})
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	// summarised waits for ns's summary to count the observation write
	// rev: the aggregator took in every observation written before it.
	summarised := func(ns string, rev uint64) {
		t.Helper()
		storetest.Eventually(t, 10*time.Second, fmt.Sprintf("%s summarised through observation %d", ns, rev), func() bool {
			sums, err := fleet.Read(ctx, s)
			return err == nil && sums[ns].Observed >= rev && sums[ns].Counts == store.Counts{Ready: 1}
		})
	}
	flush := func(w *agent.ObservedWriter) uint64 {
		t.Helper()
		rev, err := w.Flush(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	summarised("shop", flush(shop))
	summarised("cafe", flush(cafe))
	before := statusRev("shop")
	for range 5 {
		flush(shop)
	}
	// A change on another machine, written after the rewrites and
	// summarised: the aggregator has seen the rewrites by then.
	cafeState = store.InstanceBackoff
	rev := flush(cafe)
	storetest.Eventually(t, 10*time.Second, "cafe's change summarised", func() bool {
		sums, err := fleet.Read(ctx, s)
		return err == nil && sums["cafe"].Observed >= rev && sums["cafe"].Counts == store.Counts{Backoff: 1}
	})
	if after := statusRev("shop"); after != before {
		t.Fatalf("shop's summary was rewritten (revision %d, was %d) by observations that did not change", after, before)
	}
	// A change is summarised as before.
	shopState = store.InstanceBackoff
	rev = flush(shop)
	storetest.Eventually(t, 10*time.Second, "shop's change summarised", func() bool {
		sums, err := fleet.Read(ctx, s)
		return err == nil && sums["shop"].Observed >= rev && sums["shop"].Counts == store.Counts{Backoff: 1}
	})
}
