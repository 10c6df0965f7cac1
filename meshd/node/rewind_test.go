package node_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The store goes back in time under a running mesh: its node restarts
// from a copy taken before beta joined. Alpha converges on the store's
// peer set: beta, whom the store forgot, leaves its WireGuard config once
// alpha has read the whole peer state again after the reconnect; beta
// says it is no member any more.
func TestRewoundStoreForgetsPeers(t *testing.T) {
	dir, old, addr := t.TempDir(), filepath.Join(t.TempDir(), "old"), storetest.FreeAddr(t)
	c := &cluster{srv: storetest.StartIn(t, dir, addr)}
	serve := func() func() {
		stop, err := registrar.Serve(context.Background(), c.srv.Store, registrar.Config{Cooldown: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return stop
	}
	stopRegistrar := serve()
	a := c.join(t, "alpha")

	stopRegistrar()
	c.srv.NATS.Shutdown()
	c.srv.NATS.WaitForShutdown()
	if out, err := exec.Command("cp", "-a", dir, old).CombinedOutput(); err != nil {
		t.Fatalf("copying the store: %v: %s", err, out)
	}
	c.srv = storetest.StartIn(t, dir, addr)
	stopRegistrar = serve()
	b := c.join(t, "beta")
	storetest.Eventually(t, 10*time.Second, "alpha to know beta", func() bool {
		p, ok := a.peer(t, "beta")
		return ok && p.Active
	})

	stopRegistrar()
	c.srv.NATS.Shutdown()
	c.srv.NATS.WaitForShutdown()
	c.srv = storetest.StartIn(t, old, addr)
	storetest.Eventually(t, 20*time.Second, "alpha to drop beta, whom the store forgot", func() bool {
		_, ok := a.peer(t, "beta")
		return !ok && a.status(t).Control.Watch == "live"
	})
	storetest.Eventually(t, 10*time.Second, "beta to say it is no member", func() bool { return !b.status(t).Member })
	if _, ok := b.peer(t, "alpha"); !ok {
		t.Error("beta dropped alpha, whom the store knows")
	}
}
