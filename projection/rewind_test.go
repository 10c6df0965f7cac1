package projection_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// rewindFixture is a store whose directory was copied at one deploy (w1)
// and then went on to two more (w2, w3), with a projection that applied
// them all: old is the copy, the store the projection will find after a
// rewind.
type rewindFixture struct {
	dir, old, addr string
	p              *running
	applied        uint64
}

func newRewindFixture(t *testing.T) *rewindFixture {
	t.Helper()
	return newRewindFixtureSnap(t, "")
}

// newRewindFixtureSnap is newRewindFixture with the projection writing
// its snapshot to snapshotPath.
func newRewindFixtureSnap(t *testing.T, snapshotPath string) *rewindFixture {
	t.Helper()
	f := &rewindFixture{dir: t.TempDir(), old: t.TempDir() + "/old", addr: storetest.FreeAddr(t)}
	ctx := ctxT(t)
	srv := storetest.StartIn(t, f.dir, f.addr)
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9001, "w1")}); err != nil {
		t.Fatal(err)
	}
	// A consistent copy: the node stopped, its directory copied.
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	// cp -a: modes too (the signer key must stay private).
	if out, err := exec.Command("cp", "-a", f.dir, f.old).CombinedOutput(); err != nil {
		t.Fatalf("copying the store: %v: %s", err, out)
	}
	srv = storetest.StartIn(t, f.dir, f.addr)
	f.p = start(t, projection.Config{Connect: connectTo(t, srv.URL), SnapshotPath: snapshotPath})
	for i, id := range []string{"w2", "w3"} {
		_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9002+i, id)})
		if err != nil {
			t.Fatal(err)
		}
		f.applied = seq
	}
	waitSeq(t, f.p.Projection, f.applied)
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, wait, "projection to notice NATS is gone", func() bool { return !f.p.Status().Connected })
	return f
}

// serves is the endpoint the projection routes shop.example.com to.
func (f *rewindFixture) serves() string {
	s, ok := f.p.View().Lookup("shop.example.com", "/")
	if !ok {
		return ""
	}
	return endpointIDs(s)
}

// The store comes back older than what the gateway applied (its head
// before the gateway's sequence): the gateway rebuilds and serves what the
// store holds, then follows the next deploy.
func TestRewoundStoreBehindRebuilds(t *testing.T) {
	f := newRewindFixture(t)
	ctx := ctxT(t)
	srv := storetest.StartIn(t, f.old, f.addr)
	storetest.Eventually(t, wait, "rebuild from the rewound store", func() bool {
		return f.p.Status().Rewinds >= 1 && f.serves() == "w1" && f.p.Status().Connected
	})
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9010, "w4")})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, wait, "the deploy after the rewind", func() bool { return f.serves() == "w4" })
	if st := f.p.Status(); st.AppliedSeq < seq || st.Rewinds != 1 {
		t.Errorf("after the deploy: applied %d (want %d), %d rewinds (want 1)", st.AppliedSeq, seq, st.Rewinds)
	}
}

// The store comes back older, and takes new deploys before the gateway
// reconnects, past the gateway's sequence: the stream's identity and head
// look continuous, but the events under the sequences the gateway applied
// are new ones. The gateway must not skip them as already seen.
func TestRewoundStoreWithNewEventsRebuilds(t *testing.T) {
	f := newRewindFixture(t)
	ctx := ctxT(t)
	// The rewound store on an address the gateway does not know, so that
	// it takes the deploys before the gateway sees it.
	side := storetest.StartIn(t, f.old, storetest.FreeAddr(t))
	_, seq, err := storetest.Deploy(ctx, side.Store, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9010, "w4")})
	if err != nil {
		t.Fatal(err)
	}
	if seq > f.applied {
		t.Fatalf("fixture: the new deploy's event (%d) must fall at or before the applied sequence %d", seq, f.applied)
	}
	for i := 0; seq < f.applied; i++ {
		// Other namespaces' deploys carry the head past the gateway's
		// sequence; shop/web's new event stays under it.
		if _, seq, err = storetest.Deploy(ctx, side.Store, "other"+itoa(i), map[string]storetest.Service{
			"api": {Routes: []store.Route{{Hosts: []string{"api" + itoa(i) + ".test"}}}, Instances: []storetest.Instance{{ID: "o" + itoa(i), Machine: "m1", Address: "127.0.0.1", Port: 9100 + i}}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	side.NATS.Shutdown()
	side.NATS.WaitForShutdown()

	storetest.StartIn(t, f.old, f.addr)
	storetest.Eventually(t, wait, "rebuild from the rewound store", func() bool {
		return f.p.Status().Rewinds >= 1 && f.p.Status().Connected && f.p.Status().AppliedSeq >= seq
	})
	if got := f.serves(); got != "w4" {
		t.Errorf("after the rewind the gateway serves %q, want the new deploy w4 (w2, w3 were rewound away)", got)
	}
}

// A gateway restarted against a store that went back in time serves its
// snapshot (further along) only until it reaches the store: then the
// store's older state, said loudly, and never the snapshot's.
func TestRestartOnRewoundStoreServesTheStore(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "routing.json")
	f := newRewindFixtureSnap(t, snap)
	f.p.stop() // writes its last snapshot, at w3
	storetest.StartIn(t, f.old, f.addr)
	f.p = start(t, projection.Config{Connect: connectTo(t, "nats://"+f.addr), SnapshotPath: snap})
	storetest.Eventually(t, wait, "load from the rewound store", func() bool {
		return f.p.Status().Loads >= 1 && f.p.Status().Connected
	})
	if st := f.p.Status(); f.serves() != "w1" || st.Rewinds != 1 || st.AppliedSeq >= f.applied {
		t.Errorf("restarted on the rewound store: serves %q, %d rewinds, sequence %d (snapshot's %d)", f.serves(), st.Rewinds, st.AppliedSeq, f.applied)
	}
}
