package routing_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An agent on its own machine's credentials, which may publish no routing
// event, asks for a republish of a service it runs and gets what the
// stored records say published; a service its machine runs nothing of is
// refused. (That it may ask only on its own machine's subject is the
// storage node's: store/storagenode's TestRoleScopedCredentials.)
func TestAgentAsksForARepublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := storetest.StartRoles(t, ctx)
	cs := n.Control
	as := n.Open(t, ctx, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"}, nil)

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
