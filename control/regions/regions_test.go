package regions

import (
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
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
