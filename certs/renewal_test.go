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
		Link: store.Bound(srv.Store), Name: "gw-test",
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
	if _, err := certs.NewRenewer(certs.RenewerConfig{Link: store.Bound(srv.Store)}); err == nil {
		t.Fatal("renewer without a renew function accepted")
	}
	if sts, err := certs.ListStatus(context.Background(), srv.Store); err != nil || len(sts) != 0 {
		t.Fatalf("empty status list: %v %v", sts, err)
	}
}

// Events of certificate work done outside the renewal items become status:
// a failed first issuance is recorded without scheduling anything (there
// is nothing to renew), a failed renewal is recorded and retried, and an
// event about a host the Renewer is renewing itself is not recorded twice.
func TestHandleEventRecordsFailures(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	var r *certs.Renewer
	renewErr := &store.Error{Code: "acme_error", Message: "validation failed"}
	r, err := certs.NewRenewer(certs.RenewerConfig{
		Link: store.Bound(srv.Store), Name: "gw-ev",
		Backoff: func(int) time.Duration { return time.Hour },
		Renew: func(ctx context.Context, item certs.RenewalItem) (certs.RenewResult, error) {
			// certmagic emits cert_failed from inside the renewal.
			if err := r.HandleEvent(ctx, nil, "cert_failed", map[string]any{"identifier": item.Host, "renewal": true, "error": renewErr}); err != nil {
				t.Error(err)
			}
			// Skipped: the worker records this attempt itself, after.
			if sts, _ := certs.ListStatus(ctx, srv.Store); len(sts) != 2 {
				t.Errorf("the event of a renewal in progress was recorded: %+v", sts)
			}
			return certs.RenewResult{}, renewErr
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	status := func(host string) certs.Status {
		t.Helper()
		sts, err := certs.ListStatus(ctx, srv.Store)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sts {
			if s.Host == host {
				return s
			}
		}
		t.Fatalf("no status for %s in %+v", host, sts)
		return certs.Status{}
	}
	scheduled := func() uint64 {
		t.Helper()
		info, err := storetest.Stream(t, srv.Store, srv.Store.Names.CertRenewalsStream()).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	// A first issuance failed: recorded, nothing scheduled.
	if err := r.HandleEvent(ctx, nil, "cert_failed", map[string]any{"identifier": "New.Example.com", "renewal": false, "error": renewErr}); err != nil {
		t.Fatal(err)
	}
	if s := status("new.example.com"); s.LastErrorCode != "acme_error" || s.Failures != 1 || !s.NextAttempt.IsZero() || s.Gateway != "gw-ev" {
		t.Fatalf("first issuance failure %+v", s)
	}
	if n := scheduled(); n != 0 {
		t.Fatalf("%d renewal messages after a failed first issuance, want none", n)
	}

	// A renewal failed (certmagic's own maintenance): recorded, retried.
	for i := 1; i <= 2; i++ {
		if err := r.HandleEvent(ctx, nil, "cert_failed", map[string]any{"identifier": "old.example.com", "renewal": true, "error": renewErr}); err != nil {
			t.Fatal(err)
		}
		if s := status("old.example.com"); s.Failures != i || s.NextAttempt.Sub(s.LastAttempt) != time.Hour {
			t.Fatalf("renewal failure %d: %+v", i, s)
		}
	}
	if n := scheduled(); n != 1 {
		t.Fatalf("%d renewal messages after failed renewals, want the one retry", n)
	}

	// Unknown events and events without a host are ignored.
	for _, ev := range []struct {
		name string
		data map[string]any
	}{{"cert_obtaining", map[string]any{"identifier": "x.example.com"}}, {"cert_failed", map[string]any{}}} {
		if err := r.HandleEvent(ctx, nil, ev.name, ev.data); err != nil {
			t.Fatalf("%s: %v", ev.name, err)
		}
	}

	// A renewal this Renewer works records once, although certmagic also
	// reports it as an event.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	if err := certs.ScheduleRenewal(ctx, srv.Store, certs.RenewalItem{Host: "work.example.com"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 10*time.Second, "the worked renewal's failure", func() bool {
		sts, _ := certs.ListStatus(ctx, srv.Store)
		for _, s := range sts {
			if s.Host == "work.example.com" {
				return true
			}
		}
		return false
	})
	if s := status("work.example.com"); s.Failures != 1 || s.LastErrorCode != "acme_error" {
		t.Fatalf("worked renewal status %+v", s)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
