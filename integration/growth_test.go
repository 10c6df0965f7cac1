package integration

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

// The README's growth path, end to end: a single box with deploys becomes a
// three-node cluster. Clustering the box's store in place is refused (NATS
// would delete it as orphaned streams); `control storage import` carries
// every commit, record and sequence into the fresh cluster instead, and
// refuses, changing nothing, whenever it could lose something.
func TestGrowOneBoxToCluster(t *testing.T) {
	t.Run("box without credentials", func(t *testing.T) { growOneBox(t, newCluster(t)) })
	// Its store is under the account of its own auth dir (DATA/auth), which
	// the import reads.
	t.Run("box with --auth on", func(t *testing.T) { growOneBox(t, newAuthCluster(t)) })
}

func growOneBox(t *testing.T, box *cluster) {
	ctx := context.Background()
	box.join("m1")
	for _, v := range []string{"1", "2"} {
		if out, e, code := box.control("deploy", "apply", "-f", writeManifest(t, box.dir, v), "--drain-grace", "10ms", "--gateway-wait", "1s"); code != 0 {
			t.Fatalf("apply v%s on the box: %d\n%s\n%s", v, code, out, e)
		}
	}
	live, err := box.store.LiveCommit(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]jetstream.StreamState{}
	for _, name := range box.store.StreamNames() {
		st, err := box.store.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = st.CachedInfo().State
	}

	sc := newStorageCluster(t)
	importCmd := func() (string, string, int) {
		return sc.control(1, "storage", "import", "--from", box.serverDir(), "--auth-dir", filepath.Join(sc.dir, "auth"))
	}
	// While the box runs, its store is not read: two servers on one store
	// would corrupt it.
	if out, e, code := importCmd(); code == 0 || !strings.Contains(e, "in use by another process") {
		t.Fatalf("import from a running box: %d\n%s\n%s", code, out, e)
	}
	box.agents["m1"].stop(syscall.SIGTERM)
	box.server.stop(syscall.SIGTERM)

	// Clustering the box's own store in place is refused, loudly.
	routes := freeAddr(t)
	out, e, code := runControl(t, nil, "server", "--data", box.serverDir(), "--listen", "127.0.0.1:0", "--name", "a",
		"--cluster-listen", routes, "--routes", routes, "--stun-listen", "")
	if code == 0 || !strings.Contains(e, "single-box store") || !strings.Contains(e, "control storage import --from") {
		t.Fatalf("clustering the box's store in place: %d\n%s\n%s", code, out, e)
	}
	if l, err := storagenode.ReadStoreLayout(box.serverDir()); err != nil || !l.Standalone() {
		t.Fatalf("the refused start changed the box's store: %+v %v", l, err)
	}

	// Wrong sources are refused before anything is read or changed: a
	// storage node's own store, a dir without a store, keys of another
	// account.
	for _, tc := range []struct{ from, says string }{
		{filepath.Join(sc.dir, "s1"), "storage node's store of a cluster"},
		{t.TempDir(), "holds no JetStream store"},
	} {
		if out, e, code := sc.control(1, "storage", "import", "--from", tc.from, "--auth-dir", filepath.Join(sc.dir, "auth")); code == 0 || !strings.Contains(e, tc.says) {
			t.Fatalf("import from %s: %d\n%s\n%s", tc.from, code, out, e)
		}
	}
	if box.creds != "" {
		out, e, code := sc.control(1, "storage", "import", "--from", box.serverDir(), "--from-auth-dir", filepath.Join(sc.dir, "auth"), "--auth-dir", filepath.Join(sc.dir, "auth"))
		if code == 0 || !strings.Contains(e, "is for account") {
			t.Fatalf("import with another installation's keys: %d\n%s\n%s", code, out, e)
		}
	}

	began := time.Now()
	out, e, code = importCmd()
	if code != 0 {
		t.Fatalf("storage import: %d\n%s\n%s", code, out, e)
	}
	took := time.Since(began)
	t.Logf("import took %s:\n%s", took.Round(time.Millisecond), out)

	cs := sc.open(1, sc.creds)
	got, err := cs.LiveCommit(ctx, "shop")
	if err != nil || got.ID != live.ID {
		t.Fatalf("live commit in the cluster: %+v %v, the box had %s", got, err, live.ID)
	}
	// The box's intent verifies in the cluster: its signers were carried
	// over under the cluster's trust root.
	rs, err := cs.LoadRouting(ctx)
	if err != nil || len(rs.Refused) > 0 || len(rs.Services) == 0 {
		t.Fatalf("routing in the cluster: %v; refused %v", err, rs.Refused)
	}
	// Observations, leases, the servers' announcements and the floor are
	// not carried over; the cluster keeps its own signers.
	skipped := map[string]bool{"KV_" + cs.Names.SignersBucket(): true, "KV_" + cs.Names.LocksBucket(): true, "KV_" + cs.Names.MetaBucket(): true}
	for _, b := range cs.Names.ObservationBuckets() {
		skipped["KV_"+b] = true
	}
	pl := placementOf(t, cs)
	for name, w := range want {
		if skipped[name] || w.LastSeq == 0 {
			continue // observations, and streams the box never wrote
		}
		st, err := cs.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		g := st.CachedInfo().State
		if g.Msgs != w.Msgs || g.FirstSeq != w.FirstSeq || g.LastSeq != w.LastSeq {
			t.Errorf("%s: the cluster has %d messages %d..%d, the box had %d %d..%d", name, g.Msgs, g.FirstSeq, g.LastSeq, w.Msgs, w.FirstSeq, w.LastSeq)
		}
		if !strings.HasPrefix(pl[name], "R3 ") {
			t.Errorf("%s imported as %s, want R3", name, pl[name])
		}
	}
	hist, e, code := sc.control(1, "deploy", "history", "shop")
	if code != 0 || !strings.Contains(hist, live.ID) {
		t.Fatalf("deploy history in the cluster: %d\n%s\n%s", code, hist, e)
	}
	if ls, _, code := sc.control(1, "machine", "ls"); code != 0 || !strings.Contains(ls, "m1") {
		t.Fatalf("machine ls in the cluster:\n%s", ls)
	}

	// Again: everything is already there, nothing changes.
	if out, e, code := importCmd(); code != 0 || !strings.Contains(out, "already imported") || !strings.Contains(out, "imported 0 streams") {
		t.Fatalf("a second import: %d\n%s\n%s", code, out, e)
	}
	// The box's agent carries on against the cluster with its own role's
	// credentials (its instances kept running), and the next deploy
	// continues the box's history.
	agentCreds := sc.issue(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"})
	agent := start(t, "agent m1 (cluster)", []string{"EDGEPLANE_NATS=" + sc.url(1), "EDGEPLANE_NATS_CREDS=" + agentCreds},
		bins.control, "agent", "--data", box.agentDir("m1"), "--stop-grace", "2s")
	agent.waitOutput(t, `agent serving`, 15*time.Second)
	if out, e, code := sc.control(1, "deploy", "apply", "-f", writeManifest(t, box.dir, "3"), "--drain-grace", "10ms", "--gateway-wait", "1s"); code != 0 {
		t.Fatalf("apply v3 on the cluster: %d\n%s\n%s", code, out, e)
	}
	next, err := cs.LiveCommit(ctx, "shop")
	if err != nil || next.Revision != live.Revision+1 {
		t.Fatalf("the cluster's first deploy: %+v %v; the box ended at revision %d", next, err, live.Revision)
	}

	// Now the cluster has data of its own (that deploy): an import is
	// refused before it touches anything.
	commits, err := cs.JS.Stream(ctx, cs.Names.DeployCommitsStream())
	if err != nil {
		t.Fatal(err)
	}
	before := commits.CachedInfo().State
	out, e, code = importCmd()
	if code == 0 || !strings.Contains(e, "already holds data of its own") || !strings.Contains(e, "Nothing was changed") {
		t.Fatalf("import over the cluster's own data: %d\n%s\n%s", code, out, e)
	}
	info, err := commits.Info(ctx)
	if err != nil || info.State.LastSeq != before.LastSeq || info.State.Msgs != before.Msgs {
		t.Fatalf("the refused import changed the commits: %+v -> %+v (%v)", before, info.State, err)
	}
	if got, err := cs.LiveCommit(ctx, "shop"); err != nil || got.ID != next.ID {
		t.Fatalf("live commit after the refused import: %+v %v", got, err)
	}
	t.Logf("grow: import took %s, streams identical, re-import changed nothing, the box's agent deployed revision %d through the cluster, a conflicting import was refused",
		took.Round(time.Millisecond), next.Revision)
}
