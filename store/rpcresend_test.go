package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A call asked again (its first ask or answer lost in the storage node) is
// answered once: a second ask while the first runs waits for its answer,
// one after gets the same answer, and the handler runs once. A different
// request under the same call ID is not an ask of it.
func TestServeAnswersACallOnce(t *testing.T) {
	srv := storetest.Start(t)
	nc := srv.Store.NC
	var runs atomic.Int64
	release := make(chan struct{})
	stop, err := store.Serve(t.Context(), nc, srv.Store.Names.NodeListenSubject("m1"), srv.Store.Names.NodeQueueGroup("m1"), "node.m1",
		func(ctx context.Context, command string, data []byte) (any, error) {
			n := runs.Add(1)
			if n == 1 {
				<-release
			}
			return n, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(reply, id, body string) {
		m := &nats.Msg{Subject: srv.Store.Names.RPCSubject("m1", "capacity"), Reply: inbox + "." + reply, Data: []byte(body), Header: nats.Header{}}
		m.Header.Set(store.CallIDHeader, id)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
	}
	next := func(want string) {
		t.Helper()
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if m.Header.Get(store.CallsOnceHeader) == "" {
			t.Errorf("the answer does not say the call is answered once: %v", m.Header)
		}
		if got := string(m.Data); got != want {
			t.Errorf("answer on %s: %s, want %s", m.Subject, got, want)
		}
	}
	ask("a", "call-1", "{}")
	storetest.Eventually(t, 5*time.Second, "the first ask taken", func() bool { return runs.Load() == 1 })
	ask("b", "call-1", "{}")
	close(release)
	next(`{"result":1}`)
	next(`{"result":1}`)
	ask("c", "call-1", "{}")
	next(`{"result":1}`)
	ask("d", "call-1", `{"other":true}`)
	next(`{"result":2}`)
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times for one call asked three times and another, want 2", n)
	}
}

// A responder of an earlier release (no call IDs, no word that it answers
// a call once) is never asked twice, however long it takes: it would run
// the command again.
func TestCallAsksAnEarlierResponderOnce(t *testing.T) {
	srv := storetest.Start(t)
	nc := srv.Store.NC
	var asks atomic.Int64
	sub, err := nc.Subscribe(srv.Store.Names.RPCSubject("old", "capacity"), func(m *nats.Msg) {
		if asks.Add(1) == 1 {
			go func() {
				time.Sleep(2500 * time.Millisecond) // the slow command itself
				_ = m.Respond([]byte(`{"result":7}`))
			}()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for range 2 { // the second call: after an answer without the header
		var got int
		if err := srv.Store.Call(t.Context(), "old", "capacity", struct{}{}, &got); err != nil || got != 7 {
			t.Fatalf("call: %d, %v", got, err)
		}
		if n := asks.Load(); n != 1 {
			t.Fatalf("asked %d times, want once", n)
		}
		asks.Store(0)
	}
}

// A call to a responder that answers once is asked again while it is not
// answered: an ask lost in the storage node costs a second, not the call.
func TestCallAsksAgainUntilAnswered(t *testing.T) {
	srv := storetest.Start(t)
	nc := srv.Store.NC
	// A responder that answers once (it says so) and whose every call's
	// first ask is lost after the first call.
	var calls, asks atomic.Int64
	seen := map[string]bool{}
	sub, err := nc.Subscribe(srv.Store.Names.RPCSubject("m2", "capacity"), func(m *nats.Msg) {
		asks.Add(1)
		id := m.Header.Get(store.CallIDHeader)
		if calls.Load() > 0 && !seen[id] {
			seen[id] = true
			return
		}
		calls.Add(1)
		_ = m.RespondMsg(&nats.Msg{Data: []byte(`{"result":1}`), Header: nats.Header{store.CallsOnceHeader: []string{"1"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := srv.Store.Call(t.Context(), "m2", "capacity", struct{}{}, nil); err != nil {
		t.Fatal(err)
	}
	asks.Store(0)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := srv.Store.Call(ctx, "m2", "capacity", struct{}{}, nil); err != nil {
		t.Fatalf("a call whose first ask was lost: %v", err)
	}
	if n := asks.Load(); n != 2 {
		t.Fatalf("asked %d times, want 2 (the lost ask, then the one answered)", n)
	}
}

// "No responders" is asked again briefly for an agent known to answer
// once (the storage node says it for an instant while it rebuilds the
// account), and an agent that is gone is still said so, within about a
// second.
func TestCallToAnAgentThatLeftSaysNoResponders(t *testing.T) {
	srv := storetest.Start(t)
	stop, err := store.Serve(t.Context(), srv.Store.NC, srv.Store.Names.NodeListenSubject("m3"), srv.Store.Names.NodeQueueGroup("m3"), "node.m3",
		func(ctx context.Context, command string, data []byte) (any, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Store.Call(t.Context(), "m3", "capacity", struct{}{}, nil); err != nil {
		t.Fatal(err)
	}
	stop()
	_ = srv.Store.NC.Flush()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	begun := time.Now()
	err = srv.Store.Call(ctx, "m3", "capacity", struct{}{}, nil)
	var f *store.RPCFailure
	if !errors.As(err, &f) || f.Cause != store.CauseNoResponders {
		t.Fatalf("a call to an agent that left: %v, want no responders", err)
	}
	if took := time.Since(begun); took > 3*time.Second {
		t.Fatalf("said no responders after %s, want about a second", took)
	}
}
