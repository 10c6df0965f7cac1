package regions

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A region is known by a machine in it or by a record alone; a machine's
// state in placement is the stricter of its own and its region's.
func TestKnownAndPlacementState(t *testing.T) {
	machines := map[string]store.MachineRecord{"m1": {ID: "m1", Region: "fra"}, "m2": {ID: "m2", Region: "fra"}, "m3": {ID: "m3"}}
	records := map[string]store.RegionRecord{"ams": {Name: "ams", State: store.RegionDisabled}}
	known := Known(machines, records)
	if strings.Join(known, ",") != "ams,fra" {
		t.Fatalf("known %v", known)
	}
	if err := Check("fra", known); err != nil {
		t.Fatal(err)
	}
	if se := store.AsError(Check("nyc", known)); se == nil || se.Code != store.CodeInvalid || se.Detail["region"] != "nyc" ||
		!strings.Contains(se.Message, "known regions: ams, fra") {
		t.Fatalf("unknown region: %+v", se)
	}
	if StateOf(records, "fra") != store.RegionActive || StateOf(records, "ams") != store.RegionDisabled || StateOf(records, "") != store.RegionActive {
		t.Fatal("StateOf")
	}
	for _, tc := range []struct{ machine, region, want string }{
		{store.MachineActive, store.RegionActive, store.MachineActive},
		{store.MachineActive, store.RegionDraining, store.MachineDraining},
		{store.MachineActive, store.RegionDisabled, store.MachineDisabled},
		{store.MachineDraining, store.RegionActive, store.MachineDraining},
		{store.MachineDraining, store.RegionDisabled, store.MachineDisabled},
		{store.MachineDisabled, store.RegionDraining, store.MachineDisabled},
	} {
		if got := PlacementState(tc.machine, tc.region); got != tc.want {
			t.Errorf("machine %s in a %s region: %s, want %s", tc.machine, tc.region, got, tc.want)
		}
	}
}

// A region state is not set while a live gateway is of a release before
// regions (it would refuse the event and serve the region as before):
// version_skew, naming it, and nothing published; once it reports a
// current release, the state is set.
func TestSetRefusedWhileAGatewayCannotReadRegions(t *testing.T) {
	srv := storetest.Start(t)
	ctx := t.Context()
	s := srv.Store
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.MachinesBucket()), "m1",
		&store.MachineRecord{Version: store.RecordVersion, ID: "m1", Region: "fra", State: store.MachineActive, Address: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.39.0", Generation: 3, At: time.Now().UTC()}
	gateways := storetest.Bucket(t, s, s.Names.GatewaysBucket())
	if _, err := store.PutJSON(ctx, gateways, store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	_, err := Set(ctx, s, "fra", store.RegionDraining, 0)
	if se := store.AsError(err); se == nil || se.Code != store.CodeVersionSkew || !strings.Contains(se.Message, "gw-old (0.39.0)") ||
		!strings.Contains(se.Message, "0.40.0") {
		t.Fatalf("drain with a v0.39.0 gateway live: %v", err)
	}
	if recs, err := s.RegionRecords(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("after the refusal: %v %v", recs, err)
	}
	// The gateway is upgraded: its report now says so.
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if ch, err := Set(ctx, s, "fra", store.RegionDraining, 0); err != nil || !ch.Changed {
		t.Fatalf("drain with every gateway current: %+v %v", ch, err)
	}
}
