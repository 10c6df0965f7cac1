package agent

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

// testCtx is a context that ends with the test, or after 30s.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// observedSeq is the last sequence of the observations' stream.
func observedSeq(t *testing.T, ctx context.Context, s *store.Store) uint64 {
	t.Helper()
	info, err := storetest.Stream(t, s, "KV_"+s.Names.ObservedBucket()).Info(ctx)
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
	ctx := testCtx(t)
	s := srv.Store
	var mu sync.Mutex
	seen := map[string]store.ObservedInstance{}
	// One write at a time, each of the snapshot it took: the n-th
	// snapshot is the n-th write's.
	var snapshots []map[string]store.ObservedInstance
	w := NewObservedWriter(s, "m1", func() map[string]store.ObservedInstance {
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
	if _, err := store.GetJSON(ctx, storetest.Bucket(t, s, s.Names.ObservedBucket()), "m1", &o); err != nil {
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
	ctx := testCtx(t)
	s := srv.Store
	state := store.InstanceStarting
	w := NewObservedWriter(s, "m1", func() map[string]store.ObservedInstance {
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
	if _, err := store.GetJSON(ctx, storetest.Bucket(t, s, s.Names.ObservedBucket()), "m1", &o); err != nil {
		t.Fatal(err)
	}
	if o.Instances["i1"].State != store.InstanceReady {
		t.Fatalf("stored %+v, want i1 ready", o.Instances)
	}
}
