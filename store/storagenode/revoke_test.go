package storagenode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A revoked user is disconnected at once and refused from then on, also by
// a storage node that restarts; other users are not touched.
func TestRevokedCredentialsAreRefused(t *testing.T) {
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctlCreds := writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleControl})
	agentCreds := writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"})
	gwCreds := writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw1"})

	// start runs the storage node as `control server` does: the server,
	// the store, and the revocations watch.
	start := func(listen string) (string, *store.Store, func()) {
		t.Helper()
		ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: listen, Auth: auth})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: ctlCreds})
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.Provision(ctx, nc, names, store.Layout{})
		if err != nil {
			t.Fatal(err)
		}
		stop, err := storagenode.WatchRevocations(ctx, s, ns, auth, func(err error) { t.Errorf("revocations: %v", err) })
		if err != nil {
			t.Fatal(err)
		}
		return ns.ClientURL(), s, func() { stop(); nc.Close(); ns.Shutdown(); ns.WaitForShutdown() }
	}
	url, s, stop := start("127.0.0.1:0")
	closed := make(chan error, 1)
	agent, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: agentCreds})
	if err != nil {
		t.Fatal(err)
	}
	agent.SetDisconnectErrHandler(func(_ *nats.Conn, err error) {
		select {
		case closed <- err:
		default:
		}
	})
	defer agent.Close()
	gw, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: gwCreds})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()

	b, err := os.ReadFile(agentCreds)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := store.UserOfCreds(b)
	if err != nil || rev.Role != storagenode.RoleAgent || rev.Machine != "m1" {
		t.Fatalf("reading the agent's credentials: %+v %v", rev, err)
	}
	if err := s.RevokeUser(ctx, &store.Revocation{User: "not-a-key"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("revoking a malformed key: want invalid, got %v", err)
	}
	rev.Reason = "machine m1 was stolen"
	if err := s.RevokeUser(ctx, rev); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		t.Logf("the revoked agent was disconnected: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked agent's connection stayed open")
	}
	if nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: agentCreds, Timeout: 2 * time.Second}); err == nil {
		nc.Close()
		t.Fatal("revoked credentials connected again")
	}
	if err := gw.Flush(); err != nil || !gw.IsConnected() {
		t.Fatalf("the gateway lost its connection to another user's revocation: %v", err)
	}

	// After a restart, the revocation comes back from the store.
	stop()
	url, _, stop = start(url[strings.Index(url, "://")+3:])
	defer stop()
	if nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: agentCreds, Timeout: 2 * time.Second}); err == nil {
		nc.Close()
		t.Fatal("the restarted node accepted the revoked credentials")
	}
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: gwCreds})
	if err != nil {
		t.Fatalf("a gateway after the restart: %v", err)
	}
	nc.Close()
}
