package certs_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestRegisteredDomain(t *testing.T) {
	cases := map[string]string{
		"shop.example.com":      "example.com",
		"Shop.Example.COM.":     "example.com",
		"*.eu.shop.example.com": "example.com",
		"a.b.example.co.uk":     "example.co.uk",
		"x.user.github.io":      "user.github.io",
		"bücher.example":        "xn--bcher-kva.example",
		"10.1.2.3":              "10.1.2.3",
		"co.uk":                 "co.uk",
	}
	for in, want := range cases {
		if got, err := certs.RegisteredDomain(in); err != nil || got != want {
			t.Errorf("RegisteredDomain(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestBudgetRefusesPastTheLimitAndSlides(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err := certs.NewBudget(store.Bound(srv.Store), certs.BudgetOptions{Limit: 3, Window: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range []string{"a.example.co.uk", "B.example.co.uk.", "c.example.co.uk"} {
		u, err := b.Charge(ctx, h)
		if err != nil || u.Used != i+1 || u.Domain != "example.co.uk" {
			t.Fatalf("charge %d: %+v %v", i, u, err)
		}
		now = now.Add(10 * time.Minute)
	}
	_, err = b.Charge(ctx, "d.example.co.uk")
	se := store.AsError(err)
	if se == nil || se.Code != certs.CodeBudgetExhausted || se.Detail["domain"] != "example.co.uk" ||
		se.Detail["next_allowed"] != "2026-01-01T01:00:00Z" {
		t.Fatalf("charge past the limit: %v", err)
	}
	if u, _ := b.Usage(ctx, "example.co.uk"); u.Used != 3 {
		t.Fatalf("a refused charge was counted: %+v", u)
	}
	if _, err := b.Charge(ctx, "other.example.net"); err != nil {
		t.Fatalf("another domain is not affected: %v", err)
	}
	now = time.Date(2026, 1, 1, 1, 0, 1, 0, time.UTC) // the first order left the window
	if u, err := b.Charge(ctx, "d.example.co.uk"); err != nil || u.Used != 3 {
		t.Fatalf("after the window slid: %+v %v", u, err)
	}
	if _, err := b.Charge(ctx, "a..b"); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("bad host: %v", err)
	}
	if _, err := certs.NewBudget(store.Bound(srv.Store), certs.BudgetOptions{Limit: -1}); err == nil {
		t.Fatal("negative limit accepted")
	}
}

// Gateways charging at once over separate connections never overspend:
// every charge is a compare-and-set on the record's revision.
func TestBudgetConcurrentChargesAreAtomic(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		b, err := certs.NewBudget(store.Bound(srv.Connect(t)), certs.BudgetOptions{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 6; i++ {
				_, err := b.Charge(ctx, "race.example.com")
				switch {
				case err == nil:
					ok.Add(1)
				case store.HasCode(err, certs.CodeBudgetExhausted):
					refused.Add(1)
				default:
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || refused.Load() != 14 {
		t.Fatalf("granted %d refused %d, want 10 and 14", ok.Load(), refused.Load())
	}
}

// With the store unreachable no order can be counted, so none may be
// placed: a charge fails at once with store_unavailable and, once the store
// is back, nothing was counted.
func TestBudgetRefusesWhileTheStoreIsUnreachable(t *testing.T) {
	addr, dir := storetest.FreeAddr(t), t.TempDir()
	l, err := store.NewLink(store.Config{NATSURL: "nats://" + addr}, store.LinkOptions{Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := certs.NewBudget(l, certs.BudgetOptions{Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	if _, err := b.Charge(ctx, "offline.example.com"); !store.HasCode(err, store.CodeStoreUnavailable) {
		t.Fatalf("charge with the store unreachable: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the refusal took %s", took)
	}
	storetest.StartIn(t, dir, addr)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := l.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if u, err := b.Usage(ctx, "offline.example.com"); err != nil || u.Used != 0 {
		t.Fatalf("usage after the outage: %+v, %v; want nothing counted", u, err)
	}
	if u, err := b.Charge(ctx, "offline.example.com"); err != nil || u.Used != 1 {
		t.Fatalf("charge once the store is back: %+v, %v", u, err)
	}
}
