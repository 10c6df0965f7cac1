package routing_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// An agent on its own machine's credentials, which may publish no routing
// event, asks for a republish of a service it runs and gets what the
// stored records say published; a service its machine runs nothing of is
// refused. (That it may ask only on its own machine's subject is the
// storage node's: store/storagenode's TestRoleScopedCredentials.)
func TestAgentAsksForARepublish(t *testing.T) {
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	node, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { node.Shutdown(); node.WaitForShutdown() }()
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connect := func(r storagenode.CredsRequest) *nats.Conn {
		t.Helper()
		b, err := auth.IssueCreds(r)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), r.Role+r.Machine+".creds")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		nc, err := store.Connect(store.ConnectOptions{URL: node.ClientURL(), CredsFile: p})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	cs, err := store.Provision(ctx, connect(storagenode.CredsRequest{Role: storagenode.RoleControl}), names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Server(ctx, cs, filepath.Join(dir, "auth"), dir, "test"); err != nil {
		t.Fatal(err)
	}
	as, err := store.Open(ctx, connect(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"}), names)
	if err != nil {
		t.Fatalf("agent binds the store: %v", err)
	}

	stopRepublish, err := routing.ServeRepublish(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	defer stopRepublish()
	commit := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}, "api": {}}},
		Slots:    []store.SlotAssignment{{Service: "web", Slot: 0, InstanceID: "w1", Machine: "m1", Revision: 1}}}
	if _, err := cs.AppendCommit(ctx, commit); err != nil {
		t.Fatal(err)
	}
	web := store.InstanceRecord{Version: store.RecordVersion, ID: "w1", Namespace: "shop", Service: "web", Revision: 1,
		Machine: "m1", Address: "127.0.0.1", Port: 8080, State: store.InstanceReady}
	if _, err := as.PutInstance(ctx, &web); err != nil {
		t.Fatal(err)
	}
	// Endpoints are reached at their machine's admitted address: m1 is
	// a member.
	if err := cs.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if ev := republished(t, as, cs, "m1", "shop", "web"); len(ev.Endpoints) != 1 || ev.Endpoints[0].InstanceID != "w1" {
		t.Fatalf("republished shop/web: %+v", ev)
	}
	if _, err := as.RequestRepublish(ctx, "m1", "shop", "api"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("republishing a service m1 runs nothing of: want not_found, got %v", err)
	}
}
