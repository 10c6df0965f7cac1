package store_test

import (
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A region's state travels as a signed routing event: the last one per
// region is what RegionRecords and LoadRouting read, and a malformed one
// is refused before anything is published.
func TestRegionStates(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	got, err := s.RegionRecords(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("no states set: %v %v", got, err)
	}
	for _, r := range []store.RegionRecord{
		{Name: "fra", State: store.RegionDraining, By: "ops"},
		{Name: "tyo", State: store.RegionDisabled},
		{Name: "fra", State: store.RegionActive},
	} {
		if _, err := s.SetRegionState(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []store.RegionRecord{{Name: "nyc", State: "closed"}, {Name: "a.b", State: store.RegionActive}, {State: store.RegionActive}} {
		if _, err := s.SetRegionState(ctx, bad); err == nil {
			t.Errorf("%+v published", bad)
		}
	}
	got, err = s.RegionRecords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["fra"].State != store.RegionActive || got["tyo"].State != store.RegionDisabled {
		t.Fatalf("RegionRecords = %+v", got)
	}
	rs, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Regions) != 2 || rs.Regions[0].Name != "fra" || rs.Regions[1].State != store.RegionDisabled || len(rs.Skipped) != 0 {
		t.Fatalf("LoadRouting regions = %+v, skipped %v", rs.Regions, rs.Skipped)
	}
}
