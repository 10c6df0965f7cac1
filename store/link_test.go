package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A link to a store that is not there yet reports it and hands out no store;
// it binds by itself once the server is up, lets go while the server is
// down and binds again when it returns, reporting each change once.
func TestLinkDialsInTheBackground(t *testing.T) {
	addr := storetest.FreeAddr(t)
	dir := t.TempDir()
	var mu sync.Mutex
	var changes []store.LinkState
	l, err := store.NewLink(store.Config{NATSURL: "nats://" + addr}, store.LinkOptions{
		Name:    t.Name(),
		Backoff: func(int) time.Duration { return 20 * time.Millisecond },
		OnChange: func(st store.LinkState) {
			mu.Lock()
			changes = append(changes, st)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	storetest.Eventually(t, 5*time.Second, "failed dials", func() bool { return l.State().Attempts >= 3 })
	if l.Store() != nil || l.State().Connected || l.State().LastError == "" {
		t.Fatalf("unreachable store: state %+v", l.State())
	}

	srv := storetest.StartIn(t, dir, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := l.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Names().Authority != store.DefaultAuthority {
		t.Fatalf("link names %+v", l.Names())
	}
	if _, err := store.BucketOf(s, s.Names.MachinesBucket()).Status(ctx); err != nil {
		t.Fatalf("bound store does not answer: %v", err)
	}

	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, 5*time.Second, "the link to let go", func() bool { return l.Store() == nil && !l.State().Connected })

	storetest.StartIn(t, dir, addr)
	if _, err := l.Wait(ctx); err != nil {
		t.Fatalf("no rebind after the server returned: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var seen []bool
	for _, c := range changes {
		seen = append(seen, c.Connected)
	}
	// unreachable, bound, lost, bound again: one report per change, not
	// one per failed dial.
	want := []bool{false, true, false, true}
	if len(seen) != len(want) {
		t.Fatalf("changes reported %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("changes reported %v, want %v", seen, want)
		}
	}
}

// Close stops a link that never reached its store.
func TestLinkCloseWhileDialing(t *testing.T) {
	l, err := store.NewLink(store.Config{NATSURL: "nats://" + storetest.FreeAddr(t)}, store.LinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return while the link was dialing")
	}
}

// A config naming an invalid scope is refused at once.
func TestLinkRefusesAnInvalidScope(t *testing.T) {
	if _, err := store.NewLink(store.Config{Authority: "no.dots"}, store.LinkOptions{}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("invalid authority: %v", err)
	}
}
