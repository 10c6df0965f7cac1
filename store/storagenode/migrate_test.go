package storagenode_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A single box's store cannot be clustered in place (NATS deletes its
// streams as orphans); it is copied into a running cluster instead, every
// message and sequence as it was.
func TestImportSingleBoxIntoCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names, _ := store.NewNames("", "")

	// The single box, with history: superseded commits, deleted and
	// expiring keys.
	boxDir := t.TempDir()
	box, err := storagenode.Start(storagenode.Config{DataDir: boxDir, Listen: "127.0.0.1:0", ServerName: "box"})
	if err != nil {
		t.Fatal(err)
	}
	bnc, err := store.Connect(store.ConnectOptions{URL: box.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := store.Provision(ctx, bnc, names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Server(ctx, bs, filepath.Join(boxDir, "auth"), boxDir, "box"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		c := &store.DeployCommit{ID: fmt.Sprintf("d%d", i), Namespace: "shop", Kind: store.CommitFinal, Revision: int64(i),
			Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}}}}
		if _, err := bs.AppendCommit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	bsCerts := storetest.Bucket(t, bs, bs.Names.CertsBucket())
	for _, k := range []string{"cert.a.example.com.crt", "cert.b.example.com.crt"} {
		if _, err := bsCerts.Put(ctx, k, []byte("PEM "+k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := bsCerts.Delete(ctx, "cert.b.example.com.crt"); err != nil {
		t.Fatal(err)
	}
	token, _, err := invites.Create(ctx, bs, invites.Spec{Region: "eu", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	bsGateways := storetest.Bucket(t, bs, bs.Names.GatewaysBucket())
	if _, err := bsGateways.Put(ctx, "gw1", []byte(`{"version":1}`)); err != nil {
		t.Fatal(err)
	}
	// A rewritten observation, unsynced on the box (async persist mode),
	// which JetStream refuses on a replicated stream.
	if err := bs.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatal(err)
	}
	want := map[string]jetstream.StreamState{}
	for _, name := range bs.StreamNames() {
		st, err := bs.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = st.CachedInfo().State
	}
	bnc.Close()
	box.Shutdown()
	box.WaitForShutdown()

	l, err := storagenode.ReadStoreLayout(boxDir)
	if err != nil || !l.Standalone() || len(l.Accounts) != 1 || l.Accounts[0] != "$G" {
		t.Fatalf("layout of the box's store: %+v %v", l, err)
	}
	if err := storagenode.CheckClusterable(boxDir); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("clustering a single box's store in place must be refused, got %v", err)
	}

	// The cluster: three fresh storage nodes.
	nodes := startCluster(t, nil)
	cnc, err := store.Connect(store.ConnectOptions{URL: nodes[0].ns.ClientURL(), ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	if err := store.WaitForJetStream(ctx, cnc); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := storagenode.CheckClusterable(n.dir); err != nil {
			t.Fatalf("a storage node's own store: %v", err)
		}
	}

	// The box's store served again, alone, and copied over.
	release, err := storagenode.LockDataDir(boxDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storagenode.LockDataDir(boxDir); !store.HasCode(err, store.CodeBusy) {
		t.Fatalf("a second lock on a data dir in use: want busy, got %v", err)
	}
	src, err := storagenode.Start(storagenode.Config{DataDir: boxDir, Listen: "127.0.0.1:0", ServerName: "import"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { src.Shutdown(); src.WaitForShutdown(); release() }()
	snc, err := store.Connect(store.ConnectOptions{URL: src.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	defer snc.Close()
	if err := store.WaitForJetStream(ctx, snc); err != nil {
		t.Fatal(err)
	}
	// The signers bucket goes too: the cluster, which has none of its own
	// here, then verifies the box's commits under the box's trust root.
	for _, name := range []string{names.DeployCommitsStream(), "KV_" + names.CertsBucket(), "KV_" + names.InvitesBucket(), "KV_" + names.SignersBucket(),
		"KV_" + names.MachineBeatsBucket()} {
		var imp *storagenode.StreamImport
		storetest.Eventually(t, 30*time.Second, "importing "+name, func() bool {
			imp, err = storagenode.ImportStream(ctx, snc, cnc, name, 3)
			if err != nil {
				t.Logf("import %s: %v", name, err)
			}
			return err == nil
		})
		w := want[name]
		if imp.Messages != w.Msgs || imp.LastSeq != w.LastSeq || imp.FirstSeq != w.FirstSeq || imp.Replicas != 3 {
			t.Fatalf("%s: imported %+v, the box had %+v", name, imp, w)
		}
		cjs, err := jetstream.New(cnc)
		if err != nil {
			t.Fatal(err)
		}
		if str, err := cjs.Stream(ctx, name); err != nil || str.CachedInfo().Config.PersistMode != jetstream.DefaultPersistMode {
			t.Fatalf("%s imported into the cluster: %v; want it synced", name, err)
		}
	}
	// Importing onto an existing stream is refused and changes nothing.
	if _, err := storagenode.ImportStream(ctx, snc, cnc, names.DeployCommitsStream(), 3); err == nil {
		t.Fatal("import over an existing stream succeeded")
	}

	// What the cluster now reads is what the box had.
	var cs *store.Store
	storetest.Eventually(t, 30*time.Second, "provisioning the rest", func() bool {
		cs, err = store.Provision(ctx, cnc, names, store.Layout{Replicas: 3})
		return err == nil
	})
	live, err := cs.LiveCommit(ctx, "shop")
	if err != nil || live.ID != "d3" {
		t.Fatalf("live commit after import: %+v %v", live, err)
	}
	csCerts := storetest.Bucket(t, cs, cs.Names.CertsBucket())
	if ent, err := csCerts.Get(ctx, "cert.a.example.com.crt"); err != nil || string(ent.Value()) != "PEM cert.a.example.com.crt" {
		t.Fatalf("certificate after import: %v", err)
	}
	if _, err := csCerts.Get(ctx, "cert.b.example.com.crt"); err != jetstream.ErrKeyNotFound {
		t.Fatalf("a deleted certificate came back: %v", err)
	}
	if _, err := invites.Redeem(ctx, cs, token, "m1", store.InviteUseAdmit); err != nil {
		t.Fatalf("an invite issued on the box, redeemed in the cluster: %v", err)
	}
}
