package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestLeaseBusyNamesHolder(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	l, err := srv.Store.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	_, err = srv.Store.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "bob"})
	se := store.AsError(err)
	if se == nil || se.Code != store.CodeBusy || se.Detail["holder"] != "alice" {
		t.Fatalf("second acquire: got %v, want busy held by alice", err)
	}
}

// A holder that renewed its lease and then died must still lose it: renewal
// must keep the per-key TTL (a KV Update would drop it).
func TestLeaseRenewedThenDeadHolderExpires(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	holder := srv.Connect(t)
	key := store.DeployLockKey("renewed")
	l, err := holder.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "dies"})
	if err != nil {
		t.Fatal(err)
	}
	first := l.Token()
	for i := 0; i < 3; i++ {
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("renew %d: %v", i, err)
		}
	}
	if l.Token() <= first {
		t.Fatalf("renewal did not advance the fencing token: %d -> %d", first, l.Token())
	}
	holder.NC.Close() // dies without releasing
	start := time.Now()
	var l2 *store.Lease
	storetest.Eventually(t, 5*time.Second, "the dead holder's lease to expire", func() bool {
		l2, err = srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "next"})
		return err == nil
	})
	t.Logf("lease free %s after the holder died (ttl 1s)", time.Since(start).Round(time.Millisecond))
	if l2.Token() <= l.Token() {
		t.Fatalf("new holder's token %d not above the dead holder's %d", l2.Token(), l.Token())
	}
}

func TestLeaseKeepAliveHoldsPastSeveralTTLs(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	key := store.CertLockKey("shop.example.com")
	l, err := srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "live", KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	// Contend for 3.5 TTLs: every attempt must see the live holder.
	deadline := time.Now().Add(3500 * time.Millisecond)
	attempts := 0
	for time.Now().Before(deadline) {
		_, err := srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "rival"})
		if !store.HasCode(err, store.CodeBusy) {
			t.Fatalf("attempt %d while held: %v", attempts, err)
		}
		attempts++
		time.Sleep(50 * time.Millisecond) // pacing the contender, not synchronisation
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("live holder lost its lease: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "after"}); err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
}

func TestLeaseRacingAcquirersOneWins(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stores := make([]*store.Store, 8)
	for i := range stores {
		stores[i] = srv.Connect(t)
	}
	for round := 0; round < 20; round++ {
		key := store.DeployLockKey("race" + string(rune('a'+round)))
		var wins, busy atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, st := range stores {
			wg.Add(1)
			go func(st *store.Store) {
				defer wg.Done()
				<-start
				_, err := st.AcquireLease(ctx, key, store.LeaseOptions{TTL: 5 * time.Second, Holder: "r"})
				switch {
				case err == nil:
					wins.Add(1)
				case store.HasCode(err, store.CodeBusy):
					busy.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			}(st)
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 || busy.Load() != int32(len(stores)-1) {
			t.Fatalf("round %d: %d winners, %d busy", round, wins.Load(), busy.Load())
		}
	}
}

// A holder paused past expiry must not write: its fencing check and its
// renewal fail once another holder has the key.
func TestLeasePausedHolderIsFenced(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	key := store.DeployLockKey("paused")
	old, err := srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: time.Second, Holder: "paused"})
	if err != nil {
		t.Fatal(err)
	}
	var fresh *store.Lease
	storetest.Eventually(t, 5*time.Second, "expiry", func() bool {
		fresh, err = srv.Store.AcquireLease(ctx, key, store.LeaseOptions{TTL: 5 * time.Second, Holder: "fresh"})
		return err == nil
	})
	if err := old.Check(ctx); !store.HasCode(err, store.CodeLeaseLost) {
		t.Fatalf("paused holder check: got %v, want lease_lost", err)
	}
	if err := old.Renew(ctx); !store.HasCode(err, store.CodeLeaseLost) {
		t.Fatalf("paused holder renew: got %v, want lease_lost", err)
	}
	if err := old.Release(ctx); err != nil {
		t.Fatalf("releasing a lost lease: %v", err)
	}
	if err := fresh.Check(ctx); err != nil {
		t.Fatalf("the old holder's release removed the new holder's lease: %v", err)
	}
}

func TestLeaseRejectsShortTTL(t *testing.T) {
	srv := storetest.Start(t)
	if _, err := srv.Store.AcquireLease(context.Background(), "cp.lock.x", store.LeaseOptions{TTL: 10 * time.Millisecond}); err == nil {
		t.Fatal("want an error for a TTL below the minimum")
	}
}
