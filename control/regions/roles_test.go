package regions_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/regions"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An agent's and a gateway's real credentials cannot publish a region's
// state, even holding the control plane's own signer key: the storage
// node refuses the publish (a permissions violation on the region's
// subject) and no state is stored. The control role's can.
func TestOnlyTheControlRolePublishesRegionStates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := storetest.StartRoles(t, ctx)
	cs := n.Control
	if err := cs.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", Region: "fra",
		State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	subject := cs.Names.RoutingRegionSubject("fra")
	for _, r := range []storagenode.CredsRequest{{Role: storagenode.RoleAgent, Machine: "m1"}, {Role: storagenode.RoleGateway, Machine: "gw0"}} {
		n.TryAs(t, ctx, r, subject, func(ctx context.Context, s *store.Store) error {
			_, err := s.SetRegionState(ctx, store.RegionRecord{Name: "fra", State: store.RegionDisabled, By: "mallory"})
			return err
		})
		if recs, err := cs.RegionRecords(ctx); err != nil || len(recs) != 0 {
			t.Fatalf("after %s's attempt: region records %v %v", r.Role, recs, err)
		}
	}
	ch, err := regions.Set(ctx, cs, "fra", store.RegionDisabled, 0)
	if err != nil || !ch.Changed || ch.Seq == 0 {
		t.Fatalf("the control role: %+v %v", ch, err)
	}
	if recs, err := cs.RegionRecords(ctx); err != nil || recs["fra"].State != store.RegionDisabled {
		t.Fatalf("after the control role's: %v %v", recs, err)
	}
}
