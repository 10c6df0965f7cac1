package store_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// apiCalls counts the JetStream API requests of kind (say "STREAM.INFO")
// that any client of srv makes from now on. The count it returns is
// complete for what from published before the call: a marker from sent
// after them is seen after them.
func apiCalls(t *testing.T, srv *storetest.Server, kind string) func(from *nats.Conn) int64 {
	t.Helper()
	var n atomic.Int64
	marks := make(chan struct{}, 1)
	nc := srv.Conn(t)
	if _, err := nc.Subscribe("$JS.API."+kind+".>", func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, ".count-marker") {
			marks <- struct{}{}
			return
		}
		n.Add(1)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func(from *nats.Conn) int64 {
		t.Helper()
		if err := from.Publish("$JS.API."+kind+".count-marker", nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-marks:
		case <-time.After(5 * time.Second):
			t.Fatal("the count marker did not come back")
		}
		return n.Load()
	}
}

// Open asks the server nothing, and a bucket's gets and puts bind nothing:
// an agent's start costs no JetStream API round trip. What needs a
// bucket's info binds it once, on first use.
func TestOpenBindsOnFirstUse(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	infos := apiCalls(t, srv, "STREAM.INFO")
	names, _ := store.NewNames("", "")
	s, err := store.Open(ctx, srv.Conn(t), names)
	if err != nil {
		t.Fatal(err)
	}
	sInstances := store.BucketOf(s, s.Names.InstancesBucket())
	rev, err := sInstances.Put(ctx, "shop.m1.i1", []byte(`{"version":1}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := sInstances.Get(ctx, "shop.m1.i1")
	if err != nil || string(e.Value()) != `{"version":1}` || e.Revision() != rev || e.Key() != "shop.m1.i1" || e.Bucket() != names.InstancesBucket() {
		t.Fatalf("get after put: %v", err)
	}
	sMachines := store.BucketOf(s, s.Names.MachinesBucket())
	if _, err := sMachines.Get(ctx, "m9"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of a missing key: %v, want key not found", err)
	}
	for _, bad := range []string{"", ".a", "a.", "a..b", "a*", "a>", "a b"} {
		if _, err := sMachines.Get(ctx, bad); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Fatalf("get of key %q: %v, want invalid key", bad, err)
		}
		if _, err := sMachines.Put(ctx, bad, nil); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Fatalf("put of key %q: %v, want invalid key", bad, err)
		}
	}
	if n := infos(s.NC); n != 0 {
		t.Fatalf("open, get and put asked for %d stream infos, want none", n)
	}

	// A deleted key is not found, as with nats.go's own Get; the delete
	// binds the bucket, once.
	if err := sInstances.Delete(ctx, "shop.m1.i1"); err != nil {
		t.Fatal(err)
	}
	if _, err := sInstances.Get(ctx, "shop.m1.i1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get of a deleted key: %v, want key not found", err)
	}
	if _, err := sInstances.Keys(ctx); err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	if n := infos(s.NC); n != 1 {
		t.Fatalf("%d stream infos after using one bucket beyond get and put, want 1", n)
	}
}

// An authority nobody provisioned opens (Open asks nothing) but every use
// fails with an error that says what is missing, and Bind, for whoever
// must wait for provisioning, fails at once.
func TestUnprovisionedAuthorityFailsOnUse(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	names, _ := store.NewNames("", "elsewhere")
	s, err := store.Open(ctx, srv.Conn(t), names)
	if err != nil {
		t.Fatal(err)
	}
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	sMachines := store.BucketOf(s, s.Names.MachinesBucket())
	for what, err := range map[string]error{
		"get":  func() error { _, err := sMachines.Get(ctx, "m1"); return err }(),
		"put":  func() error { _, err := sMachines.Put(ctx, "m1", []byte(`{}`)); return err }(),
		"keys": func() error { _, err := sMachines.Keys(ctx); return err }(),
		"info": func() error { _, err := sRouting.Info(ctx); return err }(),
	} {
		if err == nil || !strings.Contains(err.Error(), "provisioned this authority") {
			t.Errorf("%s on an unprovisioned authority: %v", what, err)
		}
	}
	if _, err := store.Bind(ctx, srv.Conn(t), names); err == nil || !strings.Contains(err.Error(), "provisioned this authority") {
		t.Fatalf("bind of an unprovisioned authority: %v", err)
	}
	if _, err := store.Bind(ctx, srv.Conn(t), srv.Store.Names); err != nil {
		t.Fatalf("bind of the provisioned authority: %v", err)
	}
}

// A fleet that lost its storage node comes back spread over a window, never
// in lockstep, and no box waits more than two seconds once it is back.
func TestReconnectBackoffSpreads(t *testing.T) {
	for attempt, window := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 2 * time.Second, 40: 2 * time.Second} {
		seen := map[time.Duration]bool{}
		var lo, hi time.Duration = window, 0
		for range 1000 {
			d := store.ReconnectBackoff(attempt)
			if d < 0 || d >= window {
				t.Fatalf("attempt %d waits %s, outside [0, %s)", attempt, d, window)
			}
			seen[d] = true
			lo, hi = min(lo, d), max(hi, d)
		}
		if len(seen) < 900 || lo > window/10 || hi < window*9/10 {
			t.Fatalf("attempt %d: %d distinct waits between %s and %s: not spread over %s", attempt, len(seen), lo, hi, window)
		}
	}
}
