package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A write that changes nothing a summary says (an instance written again
// in the state it was in) rewrites no summary: the flush notice says the
// summary counts it, and the stored summary's own revision catches up
// within ten flushes. A change is in the store by the notice that covers
// it.
func TestUnchangedSummaryIsSaidCurrentNotRewritten(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	notices := make(chan store.FleetStatusFlushed, 64)
	stop, err := s.FollowFleetStatusFlushed(func(f *store.FleetStatusFlushed) {
		select {
		case notices <- *f:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	// told waits for the first notice that covers instance write rev.
	told := func(rev uint64) store.FleetStatusFlushed {
		t.Helper()
		for {
			select {
			case f := <-notices:
				if f.Revision >= rev {
					return f
				}
			case <-ctx.Done():
				t.Fatalf("no flush notice covering revision %d", rev)
			}
		}
	}
	bucket := storetest.Bucket(t, s, s.Names.FleetStatusBucket())
	stored := func() (uint64, *store.NamespaceStatus) {
		t.Helper()
		var st store.NamespaceStatus
		rev, err := store.GetJSON(ctx, bucket, "shop", &st)
		if err != nil {
			t.Fatal(err)
		}
		return rev, &st
	}

	const flushEvery = 100 * time.Millisecond
	a, err := fleet.New(s, fleet.Config{FlushEvery: flushEvery})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() {
		acancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	})

	rec := record("shop", "m1", "shop-web-0", store.InstanceReady)
	rev, err := s.PutInstance(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	told(rev)
	statusRev, st := stored()
	if st.Counts != (store.Counts{Ready: 1}) || st.Revision < rev {
		t.Fatalf("after the notice covering revision %d the summary is %+v through %d", rev, st.Counts, st.Revision)
	}
	written := time.Now()

	// The same state again: nothing the summary says changes.
	rec.UpdatedAt = time.Now().UTC()
	again, err := s.PutInstance(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	told(again)
	// Ten flushes is when it is written anyway; a notice well before
	// that must have left it alone.
	if time.Since(written) < 5*flushEvery {
		if r, st := stored(); r != statusRev {
			t.Fatalf("the summary was rewritten (revision %d, was %d) by a write that changed nothing in it: %+v", r, statusRev, st)
		}
	} else {
		t.Logf("the notice came %s after the write: too late to tell a refresh from a rewrite", time.Since(written))
	}
	storetest.Eventually(t, 10*time.Second, "the unchanged summary's revision brought along", func() bool {
		_, st := stored()
		return st.Revision >= again
	})

	// A change is in the store by the notice that covers it.
	rec.State, rec.UpdatedAt = store.InstanceBackoff, time.Now().UTC()
	changed, err := s.PutInstance(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	told(changed)
	if _, st := stored(); st.Counts != (store.Counts{Backoff: 1}) || st.Revision < changed {
		t.Fatalf("after the notice covering revision %d the summary is %+v through %d", changed, st.Counts, st.Revision)
	}
}
