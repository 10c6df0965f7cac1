package storagenode_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A connection of an untrusted role reaches JetStream under the edge
// prefix, which its credentials' role decides: store.Open takes the role
// from the credentials Connect read, and asks the connection for its JWT
// (a decode, with its signature check) no more.
func TestEdgeStoreOpensWithoutDecodingItsCredentialsAgain(t *testing.T) {
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleControl})})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	cs, err := store.Provision(ctx, ctl, names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.PutMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive, Address: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}

	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"})})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var asked atomic.Int32
	userJWT := nc.Opts.UserJWT
	nc.Opts.UserJWT = func() (string, error) {
		asked.Add(1)
		return userJWT()
	}
	as, err := store.Open(ctx, nc, names)
	if err != nil {
		t.Fatal(err)
	}
	// Its own machine record, by a direct get under the edge prefix: the
	// default prefix is not imported into the edge account, and the read
	// would find no responder.
	m, _, err := as.GetMachine(ctx, "m1")
	if err != nil || m.ID != "m1" {
		t.Fatalf("agent reads its machine record: %+v, %v", m, err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("opening the store asked the connection for its JWT %d times; want none (Connect read the role)", n)
	}
}
