package node_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/relay/relaytest"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A node holds an allocation on the relay the registrar announces and
// announces its relayed address. When the relay restarts (it forgets every
// allocation, and the client is not told), the node's probe through its
// own allocation stops coming back and it allocates anew.
func TestRelayAllocationRecovers(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	secret, err := srv.Store.MeshRelaySecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs := relaytest.Start(t, secret)
	addr := rs.Addr().String()
	stop, err := registrar.Serve(ctx, srv.Store, registrar.Config{Relays: []string{addr}, Cooldown: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c := &cluster{srv: srv}
	n := c.join(t, "alpha")

	var first string
	storetest.Eventually(t, 10*time.Second, "alpha holds a relayed address", func() bool {
		first = n.status(t).Relay.Address
		return first != ""
	})
	if ap := netip.MustParseAddrPort(first); ap.Addr() != rs.RelayIP() {
		t.Fatalf("relayed address %s is not on the relay's %s", first, rs.RelayIP())
	}
	storetest.Eventually(t, 10*time.Second, "alpha's heartbeat announces it", func() bool {
		beats, err := srv.Store.MeshHeartbeats(ctx)
		return err == nil && beats["alpha"].Relay == first
	})

	// A working allocation's probes come back: ten reconcile intervals
	// later it is still the same.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got := n.status(t).Relay.Address; got != first {
			t.Fatalf("alpha replaced a working allocation: %s, then %s", first, got)
		}
	}

	rs.Close()
	rs = relaytest.StartAt(t, secret, addr)
	storetest.Eventually(t, 20*time.Second, "alpha allocates anew on the restarted relay", func() bool {
		s := n.status(t)
		return s.Relay.Address != "" && s.Relay.Address != first
	})
	if rs.Stats().Allocations != 1 {
		t.Fatalf("the restarted relay holds %d allocations, want alpha's", rs.Stats().Allocations)
	}
}
