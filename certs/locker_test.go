package certs_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestLockRacersNeverBothHold(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	a := newStorage(t, srv.Store, certs.Options{LockTTL: 2 * time.Second, Holder: "a"})
	b := newStorage(t, srv.Connect(t), certs.Options{LockTTL: 2 * time.Second, Holder: "b"})
	var inside, maxInside, rounds atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	// Two spellings of one host must be one lock.
	names := []string{"issue_cert_Shop.example.com.", "issue_cert_shop.example.com"}
	for w := 0; w < 4; w++ {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				name := names[(w+i)%2]
				if err := s.Lock(ctx, name); err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				if n > maxInside.Load() {
					maxInside.Store(n)
				}
				// Real work under the lock widens the window a second
				// holder would have to slip in.
				if err := s.Store(ctx, certmagic.StorageKeys.SiteCert("iss", "shop.example.com"), []byte(fmt.Sprint(w, i))); err != nil {
					errs <- err
				}
				inside.Add(-1)
				rounds.Add(1)
				if err := s.Unlock(ctx, name); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if maxInside.Load() != 1 || rounds.Load() != 40 {
		t.Fatalf("max holders at once %d (want 1), rounds %d (want 40)", maxInside.Load(), rounds.Load())
	}
}

func TestTryLockAndUnlockOnlyOwn(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	a := newStorage(t, srv.Store, certs.Options{LockTTL: 2 * time.Second, Holder: "a"})
	b := newStorage(t, srv.Connect(t), certs.Options{LockTTL: 2 * time.Second, Holder: "b"})
	ok, err := a.TryLock(ctx, "issue_cert_x.example.com")
	if !ok || err != nil {
		t.Fatalf("first TryLock: %v %v", ok, err)
	}
	ok, err = b.TryLock(ctx, "issue_cert_X.Example.com.")
	if ok || err != nil {
		t.Fatalf("second TryLock on another spelling: %v %v, want false, nil", ok, err)
	}
	h, held, err := b.LockHolder(ctx, "issue_cert_x.example.com")
	if err != nil || !held || h.Holder != "a" {
		t.Fatalf("holder %+v %v %v", h, held, err)
	}
	// b never took it: its Unlock must fail and must not free a's lock.
	if err := b.Unlock(ctx, "issue_cert_x.example.com"); err == nil {
		t.Fatal("unlocking a lock we do not hold succeeded")
	}
	if err := b.RenewLockLease(ctx, "issue_cert_x.example.com", time.Minute); !store.HasCode(err, store.CodeLeaseLost) {
		t.Fatalf("renewing a lock we do not hold: %v", err)
	}
	if _, held, _ := b.LockHolder(ctx, "issue_cert_x.example.com"); !held {
		t.Fatal("a's lock vanished")
	}
	if err := a.RenewLockLease(ctx, "issue_cert_x.example.com", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx, "issue_cert_x.example.com"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLock(ctx, "issue_cert_x.example.com"); !ok || err != nil {
		t.Fatalf("TryLock after release: %v %v", ok, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := a.Lock(cctx, "issue_cert_x.example.com"); err == nil || !strings.Contains(err.Error(), "waiting for lock") {
		t.Fatalf("Lock past its context: %v", err)
	}
}

func TestLockLiveHolderKeepsItPastSeveralTTLs(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	const ttl = time.Second
	a := newStorage(t, srv.Store, certs.Options{LockTTL: ttl, Holder: "a"})
	b := newStorage(t, srv.Connect(t), certs.Options{LockTTL: ttl, Holder: "b"})
	if err := a.Lock(ctx, "issue_cert_live.example.com"); err != nil {
		t.Fatal(err)
	}
	// b waits for 4 TTLs and must not get it.
	wctx, cancel := context.WithTimeout(ctx, 4*ttl)
	err := b.Lock(wctx, "issue_cert_live.example.com")
	cancel()
	if err == nil {
		t.Fatal("b took a live holder's lock")
	}
	// Handoff: a releases, a waiting b gets it at once (the watch wakes it).
	got := make(chan time.Time, 1)
	go func() {
		if err := b.Lock(ctx, "issue_cert_live.example.com"); err == nil {
			got <- time.Now()
		}
	}()
	released := time.Now()
	if err := a.Unlock(ctx, "issue_cert_live.example.com"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("lock handoff after release: %s", at.Sub(released).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("b did not get the released lock")
	}
	_ = b.Unlock(ctx, "issue_cert_live.example.com")
}

// A holder killed with SIGKILL never unlocks; its lease must expire within
// the TTL so a waiter takes over.
func TestLockKilledHolderFreesWithinTTL(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	const ttl = 2 * time.Second
	h := startHelper(t, "locker", "doomed", "EP_NATS="+srv.URL, "EP_LOCK_TTL="+ttl.String())
	if l := h.do("lock issue_cert_killed.example.com", 10*time.Second); l != "OK lock" {
		t.Fatalf("helper lock: %q", l)
	}
	// Let the keep-alive renew a few times first: a renewed lease must
	// still expire.
	s := newStorage(t, srv.Store, certs.Options{LockTTL: ttl, Holder: "survivor"})
	wctx, cancel := context.WithTimeout(ctx, 2*ttl)
	if err := s.Lock(wctx, "issue_cert_killed.example.com"); err == nil {
		t.Fatal("took the lock from a live helper")
	}
	cancel()
	h.kill()
	killed := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 3*ttl)
	defer cancel()
	if err := s.Lock(lctx, "issue_cert_killed.example.com"); err != nil {
		t.Fatalf("lock of a killed holder not free: %v", err)
	}
	took := time.Since(killed)
	t.Logf("lock free %s after SIGKILL of its holder (ttl %s)", took.Round(time.Millisecond), ttl)
	// The server expires keys on a one-second tick, hence the slack.
	if took > ttl+1100*time.Millisecond {
		t.Fatalf("lock took %s to free, more than its ttl %s", took, ttl)
	}
}

// A holder paused past its lease (SIGSTOP) wakes up to find the lock taken:
// its certificate writes are refused and its unlock leaves the new holder's
// lease alone.
func TestLockPausedHolderIsFenced(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	const ttl = time.Second
	h := startHelper(t, "locker", "paused", "EP_NATS="+srv.URL, "EP_LOCK_TTL="+ttl.String())
	if l := h.do("lock issue_cert_fenced.example.com", 10*time.Second); l != "OK lock" {
		t.Fatalf("helper lock: %q", l)
	}
	key := certmagic.StorageKeys.SiteCert("iss", "fenced.example.com")
	if l := h.do("store "+key+" from-first-holder", 5*time.Second); l != "OK store" {
		t.Fatalf("store under the lock: %q", l)
	}
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	s := newStorage(t, srv.Store, certs.Options{LockTTL: 5 * time.Second, Holder: "next"})
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.Lock(lctx, "issue_cert_fenced.example.com"); err != nil {
		t.Fatal(err)
	}
	mustStore(t, s, key, "from-second-holder")
	if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if l := h.do("store "+key+" stale-write", 5*time.Second); !strings.HasPrefix(l, "ERR") || !strings.Contains(l, store.CodeLeaseLost) {
		t.Fatalf("paused holder's write: %q, want a lease_lost error", l)
	}
	if got, _ := s.Load(ctx, key); string(got) != "from-second-holder" {
		t.Fatalf("certificate overwritten by the paused holder: %q", got)
	}
	h.do("unlock issue_cert_fenced.example.com", 5*time.Second)
	if hd, held, err := s.LockHolder(ctx, "issue_cert_fenced.example.com"); err != nil || !held || hd.Holder != "next" {
		t.Fatalf("after the paused holder's unlock: %+v %v %v; want still held by next", hd, held, err)
	}
	if err := s.Unlock(ctx, "issue_cert_fenced.example.com"); err != nil {
		t.Fatal(err)
	}
}
