package certs_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Run: go test -run '^$' -bench . -benchtime 2000x ./certs/
// The Raw* benchmarks are the baseline: the same KV operations and leases
// without the storage layer; report the ratio.

func BenchmarkStore(b *testing.B) {
	srv := storetest.Start(b)
	s := newStorage(b, srv.Store, certs.Options{})
	ctx := context.Background()
	val := bytes.Repeat([]byte{'x'}, 2048)
	key := certmagic.StorageKeys.SiteCert("acme-v02.api.letsencrypt.org-directory", "shop.example.com")
	b.Run("certs.Store", func(b *testing.B) {
		for b.Loop() {
			if err := s.Store(ctx, key, val); err != nil {
				b.Fatal(err)
			}
		}
	})
	enc, _ := certs.EncodeKey(key)
	certsKV := storetest.Bucket(b, srv.Store, srv.Store.Names.CertsBucket())
	b.Run("RawKVPut", func(b *testing.B) {
		for b.Loop() {
			if _, err := certsKV.Put(ctx, enc, val); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("certs.Load", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Load(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RawKVGet", func(b *testing.B) {
		for b.Loop() {
			if _, err := certsKV.Get(ctx, enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	for i := 0; i < 200; i++ {
		_ = s.Store(ctx, fmt.Sprintf("certificates/iss/h%d.example.com/h%d.example.com.crt", i, i), val)
	}
	b.Run("certs.List200", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.List(ctx, "certificates/iss", false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkLock(b *testing.B) {
	srv := storetest.Start(b)
	s := newStorage(b, srv.Store, certs.Options{LockTTL: 10 * time.Second})
	ctx := context.Background()
	b.Run("certs.LockUnlock", func(b *testing.B) {
		for b.Loop() {
			if err := s.Lock(ctx, "issue_cert_shop.example.com"); err != nil {
				b.Fatal(err)
			}
			if err := s.Unlock(ctx, "issue_cert_shop.example.com"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RawLeaseAcquireRelease", func(b *testing.B) {
		for b.Loop() {
			l, err := srv.Store.AcquireLease(ctx, store.CertLockKey("raw.example.com"), store.LeaseOptions{TTL: 10 * time.Second, KeepAlive: true})
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Handoff: a waiter blocked in Lock on another connection takes the
	// lock after the holder's Unlock.
	other := newStorage(b, srv.Connect(b), certs.Options{LockTTL: 10 * time.Second})
	b.Run("certs.Handoff", func(b *testing.B) {
		for b.Loop() {
			if err := s.Lock(ctx, "issue_cert_handoff.example.com"); err != nil {
				b.Fatal(err)
			}
			got := make(chan error, 1)
			go func() { got <- other.Lock(ctx, "issue_cert_handoff.example.com") }()
			if err := s.Unlock(ctx, "issue_cert_handoff.example.com"); err != nil {
				b.Fatal(err)
			}
			if err := <-got; err != nil {
				b.Fatal(err)
			}
			if err := other.Unlock(ctx, "issue_cert_handoff.example.com"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBudgetCharge is what tls.issuance.edgeplane adds before each ACME
// order: one compare-and-set of the registered domain's budget record.
// Baseline: a raw KV put of a record of the same size.
func BenchmarkBudgetCharge(b *testing.B) {
	srv := storetest.Start(b)
	ctx := context.Background()
	budget, err := certs.NewBudget(store.Bound(srv.Store), certs.BudgetOptions{Limit: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	b.Run("certs.Budget.Charge", func(b *testing.B) {
		for b.Loop() {
			i++
			if _, err := budget.Charge(ctx, fmt.Sprintf("www.d%d.example", i%1000)); err != nil {
				b.Fatal(err)
			}
		}
	})
	val := bytes.Repeat([]byte{'x'}, 200)
	acmeBudget := storetest.Bucket(b, srv.Store, srv.Store.Names.AcmeBudgetBucket())
	b.Run("RawKVPut", func(b *testing.B) {
		for b.Loop() {
			i++
			if _, err := acmeBudget.Put(ctx, fmt.Sprintf("d%d=example", i%1000), val); err != nil {
				b.Fatal(err)
			}
		}
	})
}
