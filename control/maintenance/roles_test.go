package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An agent's and a gateway's real credentials cannot put a namespace
// under maintenance, even holding the control plane's own signer key: the
// storage node refuses the publish (a permissions violation on the
// maintenance subject) and no record is stored. The control role's can.
func TestOnlyTheControlRolePublishesMaintenance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := storetest.StartRoles(t, ctx)
	cs := n.Control
	if _, err := cs.AppendCommit(ctx, &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {Command: []string{"true"}}}}}); err != nil {
		t.Fatal(err)
	}
	subject := cs.Names.RoutingMaintenanceSubject("shop", "")
	for _, r := range []storagenode.CredsRequest{{Role: storagenode.RoleAgent, Machine: "m1"}, {Role: storagenode.RoleGateway, Machine: "gw0"}} {
		n.TryAs(t, ctx, r, subject, func(ctx context.Context, s *store.Store) error {
			_, err := s.SetMaintenance(ctx, store.MaintenanceRecord{Namespace: "shop", On: true, Message: "pwned", By: "mallory"})
			return err
		})
		if recs, err := cs.MaintenanceRecords(ctx); err != nil || len(recs) != 0 {
			t.Fatalf("after %s's attempt: maintenance records %v %v", r.Role, recs, err)
		}
	}
	ch, err := maintenance.Set(ctx, cs, maintenance.Request{Namespace: "shop", On: true})
	if err != nil || !ch.Changed || ch.Seq == 0 {
		t.Fatalf("the control role: %+v %v", ch, err)
	}
	if recs, err := cs.MaintenanceRecords(ctx); err != nil || len(recs) != 1 || !recs[0].On {
		t.Fatalf("after the control role's: %v %v", recs, err)
	}
}
