package store_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// observedSeq is the last sequence of the observations' stream.
func observedSeq(t *testing.T, ctx context.Context, s *store.Store) uint64 {
	t.Helper()
	str, err := s.JS.Stream(ctx, "KV_"+s.Names.ObservedBucket())
	if err != nil {
		t.Fatal(err)
	}
	info, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// Changes flushed at once go to the store in fewer writes than changes,
// and every Flush returns the revision of a write that holds the change
// its caller made before it: nothing is acknowledged before it is stored.
func TestObservedWriterCoalesces(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	var mu sync.Mutex
	seen := map[string]store.ObservedInstance{}
	// One write at a time, each of the snapshot it took: the n-th
	// snapshot is the n-th write's.
	var snapshots []map[string]store.ObservedInstance
	w := store.NewObservedWriter(s, "m1", func() map[string]store.ObservedInstance {
		mu.Lock()
		defer mu.Unlock()
		snapshots = append(snapshots, maps.Clone(seen))
		return maps.Clone(seen)
	})
	before := observedSeq(t, ctx, s)
	const changes = 200
	revs := make([]uint64, changes)
	errs := make([]error, changes)
	var wg sync.WaitGroup
	for i := range changes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			seen[fmt.Sprintf("i%d", i)] = store.ObservedInstance{Namespace: "ns", State: store.InstanceReady, UpdatedAt: time.Now().UTC()}
			mu.Unlock()
			revs[i], errs[i] = w.Flush(ctx)
		}()
	}
	wg.Wait()
	for i := range changes {
		if errs[i] != nil {
			t.Fatalf("flush %d: %v", i, errs[i])
		}
		n := int(revs[i] - before)
		if n < 1 || n > len(snapshots) {
			t.Fatalf("change %d acknowledged at revision %d, not one of the %d writes after %d", i, revs[i], len(snapshots), before)
		}
		if _, ok := snapshots[n-1][fmt.Sprintf("i%d", i)]; !ok {
			t.Fatalf("change %d was acknowledged at revision %d, which does not hold it", i, revs[i])
		}
	}
	writes := observedSeq(t, ctx, s) - before
	if int(writes) != len(snapshots) {
		t.Fatalf("%d writes stored, %d snapshots taken", writes, len(snapshots))
	}
	var o store.MachineObserved
	if _, err := store.GetJSON(ctx, s.Observed, "m1", &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Instances) != changes {
		t.Fatalf("the store holds %d instances, want %d", len(o.Instances), changes)
	}
	t.Logf("%d changes flushed at once took %d writes", changes, writes)
	if writes == 0 || writes >= changes {
		t.Fatalf("%d changes took %d writes: want at least one and fewer than the changes", changes, writes)
	}
	if w.Behind() {
		t.Fatal("writer says it is behind after every flush succeeded")
	}
}

// A write that fails leaves the writer behind, the change unacknowledged;
// the next flush writes it.
func TestObservedWriterCatchesUpAfterAFailure(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	state := store.InstanceStarting
	w := store.NewObservedWriter(s, "m1", func() map[string]store.ObservedInstance {
		return map[string]store.ObservedInstance{"i1": {Namespace: "ns", State: state, UpdatedAt: time.Now().UTC()}}
	})
	dead, cancel := context.WithCancel(ctx)
	cancel()
	state = store.InstanceReady
	if _, err := w.Flush(dead); err == nil {
		t.Fatal("flush with a cancelled context succeeded")
	}
	if !w.Behind() {
		t.Fatal("writer not behind after its write failed")
	}
	if _, err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Behind() {
		t.Fatal("writer still behind after a write succeeded")
	}
	var o store.MachineObserved
	if _, err := store.GetJSON(ctx, s.Observed, "m1", &o); err != nil {
		t.Fatal(err)
	}
	if o.Instances["i1"].State != store.InstanceReady {
		t.Fatalf("stored %+v, want i1 ready", o.Instances)
	}
}

// Readers take an instance's state from its record or its machine's
// observation, whichever is newer; an observation is never taken for an
// instance of another machine or namespace, whatever its body says.
func TestListInstancesTakesNewerObservations(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	t0 := time.Now().UTC().Add(-time.Minute)
	rec := func(id, machine string) *store.InstanceRecord {
		return &store.InstanceRecord{ID: id, Namespace: "ns", Service: "web", Machine: machine, State: store.InstanceStarting,
			Address: "10.0.0.1", Port: 8000, Driver: "process", CreatedAt: t0, UpdatedAt: t0}
	}
	for _, r := range []*store.InstanceRecord{rec("newer", "m1"), rec("older", "m1"), rec("otherns", "m1"), rec("elsewhere", "m2"), rec("unseen", "m1")} {
		if _, err := s.PutInstance(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// The stop is newer than what m1 observed of "older".
	stopped := rec("older", "m1")
	stopped.State, stopped.UpdatedAt = store.InstanceStopped, t0.Add(30*time.Second)
	if _, err := s.PutInstance(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(10 * time.Second)
	obs := func(ns string, state store.InstanceState) store.ObservedInstance {
		return store.ObservedInstance{Namespace: ns, State: state, Restarts: 2, UpdatedAt: later}
	}
	if _, err := s.PutObserved(ctx, &store.MachineObserved{Machine: "m1", Instances: map[string]store.ObservedInstance{
		"newer": obs("ns", store.InstanceReady), "older": obs("ns", store.InstanceReady), "otherns": obs("other", store.InstanceReady),
		// m1 speaking for an instance on m2.
		"elsewhere": obs("ns", store.InstanceFailed),
	}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]store.InstanceState{"newer": store.InstanceReady, "older": store.InstanceStopped, "otherns": store.InstanceStarting,
		"elsewhere": store.InstanceStarting, "unseen": store.InstanceStarting}
	check := func(got map[string]*store.InstanceRecord) {
		t.Helper()
		for id, st := range want {
			if got[id] == nil || got[id].State != st {
				t.Errorf("%s: got %+v, want state %s", id, got[id], st)
			}
		}
		if r := got["newer"]; r != nil && (r.Restarts != 2 || !r.UpdatedAt.Equal(later)) {
			t.Errorf("newer: restarts %d at %s, want the observation's 2 at %s", r.Restarts, r.UpdatedAt, later)
		}
	}
	got, err := s.NamespaceInstances(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	check(got)
	// Many machines' observations are read in batches: the same answer.
	for i := range 40 {
		m := fmt.Sprintf("pad%02d", i)
		if _, err := s.PutInstance(ctx, rec("pad-"+m, m)); err != nil {
			t.Fatal(err)
		}
	}
	got = map[string]*store.InstanceRecord{}
	if err := s.ListInstances(ctx, ">", func(_ string, r *store.InstanceRecord) error {
		got[r.ID] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check(got)
	// An observation filed under another machine's key is not read at
	// all.
	if _, err := store.PutJSON(ctx, s.Observed, "m2", &store.MachineObserved{Version: store.RecordVersion, Machine: "m1",
		Instances: map[string]store.ObservedInstance{"elsewhere": obs("ns", store.InstanceReady)}}); err != nil {
		t.Fatal(err)
	}
	got, err = s.NamespaceInstances(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	check(got)
}
