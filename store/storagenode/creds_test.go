package storagenode_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A connection of an untrusted role reaches JetStream under the edge
// prefix, which its credentials' role decides: store.Open takes the role
// from the credentials Connect read, and asks the connection for its JWT
// (a decode, with its signature check) no more.
func TestEdgeStoreOpensWithoutDecodingItsCredentialsAgain(t *testing.T) {
	_, auth, ns := startWithAuth(t)
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

// startWithAuth starts a storage node that requires credentials, with its
// trust (auth) made in a temporary dir, stopped when t ends.
func startWithAuth(t *testing.T) (dir string, auth *storagenode.Auth, ns *server.Server) {
	t.Helper()
	dir = t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	ns, err = storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return dir, auth, ns
}

// roleConn connects to ns with freshly issued credentials of r, closed
// when t ends, and the permission violations the server reports on it.
func roleConn(t *testing.T, ns *server.Server, auth *storagenode.Auth, r storagenode.CredsRequest) (*nats.Conn, chan error) {
	t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: writeCreds(t, auth, r)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	violations := make(chan error, 16)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if strings.Contains(err.Error(), "Permissions Violation") {
			select {
			case violations <- err:
			default:
			}
		}
	})
	return nc, violations
}

// refusedPublish fails t unless violations reports one on subject within
// 5 s: the server refused what the credentials tried ("could <what>").
func refusedPublish(t *testing.T, violations chan error, what, subject string) {
	t.Helper()
	select {
	case v := <-violations:
		if !strings.Contains(v.Error(), `"`+subject+`"`) {
			t.Fatalf("%s: a violation on another subject: %v", what, v)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the credentials could %s", what)
	}
}
