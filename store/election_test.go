package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// history is every revision key has had in kv, deletes included.
func history(t *testing.T, kv jetstream.KeyValue, key string) []jetstream.KeyValueEntry {
	t.Helper()
	h, err := kv.History(context.Background(), key)
	if err != nil {
		t.Fatalf("history of %s: %v", key, err)
	}
	return h
}

// A write whose answer is lost (the leader stored it, then died before
// answering) is retried, and the guards make the retry land nothing twice:
// a create or an update that finds its own value is taken as done, a
// signed append is answered as a duplicate of the first, a renewal that
// finds its own renewal keeps the lease.
func TestWritesWhoseAnswerIsLostLandOnce(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Connect(t)
	ctx := context.Background()

	store.LoseAnswers(s, 1, true)
	rec := &store.MachineRecord{ID: "m1", State: "active", Address: "10.0.0.1"}
	if err := s.CreateMachine(ctx, rec); err != nil {
		t.Fatalf("create with its answer lost: %v", err)
	}
	if h := history(t, store.BucketOf(s, s.Names.MachinesBucket()), "m1"); len(h) != 1 {
		t.Fatalf("create landed %d times", len(h))
	}

	_, rev, err := s.GetMachine(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	store.LoseAnswers(s, 1, true)
	rec.State = "draining"
	if err := s.UpdateMachine(ctx, rec, rev); err != nil {
		t.Fatalf("update with its answer lost: %v", err)
	}
	if h := history(t, store.BucketOf(s, s.Names.MachinesBucket()), "m1"); len(h) != 2 {
		t.Fatalf("create and update made %d revisions", len(h))
	}
	// The guard still refuses a real conflict: an update from the
	// revision before.
	store.LoseAnswers(s, 0, true)
	if err := s.UpdateMachine(ctx, rec, rev); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("stale update: %v, want conflict", err)
	}

	commits := s.Names.DeployCommitsStream()
	subject := s.Names.DeployCommitSubject("shop", store.CommitFinal)
	store.LoseAnswers(s, 1, true)
	seq, err := s.AppendSigned(ctx, commits, subject, []byte(`{"lost":"answer"}`))
	if err != nil {
		t.Fatalf("signed append with its answer lost: %v", err)
	}
	info, err := store.StreamOf(s, s.Names.DeployCommitsStream()).Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[subject]; n != 1 || info.State.LastSeq != seq {
		t.Fatalf("append landed %d times (last sequence %d, returned %d)", n, info.State.LastSeq, seq)
	}

	store.LoseAnswers(s, 1, true)
	l, err := s.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "alice"})
	if err != nil {
		t.Fatalf("lease with its answer lost: %v", err)
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("the lease the retry found is not ours: %v", err)
	}
	store.LoseAnswers(s, 1, true)
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renewal with its answer lost: %v", err)
	}
	// The token is the key's revision: a renewal written twice would
	// leave it behind.
	if err := l.Check(ctx); err != nil {
		t.Fatalf("after a renewal whose answer was lost: %v", err)
	}
	// Someone else's lease is still busy, retry or not.
	store.LoseAnswers(s, 0, true)
	if _, err := s.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "bob"}); !store.HasCode(err, store.CodeBusy) {
		t.Fatalf("second holder: %v, want busy", err)
	}
	store.LoseAnswers(s, 1, true)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release with its answer lost: %v", err)
	}
	if _, err := store.BucketOf(s, s.Names.LocksBucket()).Get(ctx, store.DeployLockKey("shop")); err == nil {
		t.Fatal("the released lease is still held")
	}
}

// A bucket opened lazily puts without binding, and its put rides out a
// lost answer as a bound bucket's does.
func TestLazyPutRidesOutALostAnswer(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	names, _ := store.NewNames("", "")
	s, err := store.Open(ctx, srv.Conn(t), names)
	if err != nil {
		t.Fatal(err)
	}
	store.LoseAnswers(s, 1, true)
	if err := s.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatalf("put with its answer lost: %v", err)
	}
	if _, err := store.BucketOf(s, s.Names.MachineBeatsBucket()).Get(ctx, "m1"); err != nil {
		t.Fatalf("the put did not land: %v", err)
	}
}

// A store that is not clustered has no elections to wait out: a lost
// answer fails the write at once, as a server that went away does.
func TestSingleNodeDoesNotRide(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Connect(t)
	store.LoseAnswers(s, 1, false)
	start := time.Now()
	err := s.PutMachine(context.Background(), &store.MachineRecord{ID: "m1", State: "active"})
	if !store.HasCode(err, store.CodeUnavailable) {
		t.Fatalf("put with its answer lost on a single node: %v, want unavailable", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("the failure took %s", el)
	}
}
