package certs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The renewal worker takes scheduled items from JetStream, records each
// outcome durably and schedules the retry or the next renewal. Here the
// renew function is our own stand-in for certmagic (the end-to-end test
// runs the real one against Pebble): it fails once, then succeeds.
func TestRenewerRecordsFailureThenRetries(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	expiry := time.Now().Add(90 * 24 * time.Hour).Truncate(time.Second)
	r, err := certs.NewRenewer(certs.RenewerConfig{
		Store: srv.Store, Name: "gw-test",
		Backoff: func(int) time.Duration { return time.Second },
		Renew: func(ctx context.Context, item certs.RenewalItem) (certs.RenewResult, error) {
			if calls.Add(1) == 1 {
				return certs.RenewResult{}, &store.Error{Code: "acme_error", Message: "validation failed"}
			}
			return certs.RenewResult{Issuer: "pebble", NotBefore: expiry.Add(-90 * 24 * time.Hour), Expiry: expiry}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if err := certs.ScheduleRenewal(ctx, srv.Store, certs.RenewalItem{Host: "Renew.Example.com."}, time.Now()); err != nil {
		t.Fatal(err)
	}
	var st certs.Status
	storetest.Eventually(t, 10*time.Second, "the failure in the status", func() bool {
		sts, err := certs.ListStatus(ctx, srv.Store)
		if err == nil && len(sts) == 1 && sts[0].LastError != "" {
			st = sts[0]
			return true
		}
		return false
	})
	if st.Host != "renew.example.com" || st.LastErrorCode != "acme_error" || st.Failures != 1 || st.Gateway != "gw-test" ||
		st.NextAttempt.Sub(st.LastAttempt) != time.Second {
		t.Fatalf("failure status %+v", st)
	}
	storetest.Eventually(t, 10*time.Second, "the retry to succeed", func() bool {
		sts, err := certs.ListStatus(ctx, srv.Store)
		if err == nil && len(sts) == 1 && sts[0].LastError == "" {
			st = sts[0]
			return true
		}
		return false
	})
	if st.Failures != 0 || st.Issuer != "pebble" || !st.Expiry.Equal(expiry) || !st.NextAttempt.Equal(expiry.Add(-30*24*time.Hour)) {
		t.Fatalf("success status %+v", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestScheduleRenewalRejectsBadHost(t *testing.T) {
	srv := storetest.Start(t)
	err := certs.ScheduleRenewal(context.Background(), srv.Store, certs.RenewalItem{Host: "a..b"}, time.Now())
	if !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("got %v, want invalid", err)
	}
	if _, err := certs.NewRenewer(certs.RenewerConfig{Store: srv.Store}); err == nil {
		t.Fatal("renewer without a renew function accepted")
	}
	if sts, err := certs.ListStatus(context.Background(), srv.Store); err != nil || len(sts) != 0 {
		t.Fatalf("empty status list: %v %v", sts, err)
	}
}
