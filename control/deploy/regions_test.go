package deploy

import (
	"context"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Placement reads the region states from the store: a draining region
// takes no new instance but keeps its own, a disabled region takes none
// and its instances start anew elsewhere at the service's next deploy, as
// a drained and a disabled machine's would; enabled again, a region takes
// instances again.
func TestPlacementSkipsDrainedAndDisabledRegions(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	for id, region := range map[string]string{"f1": "fra", "f2": "fra", "a1": "ams", "n1": "nyc"} {
		if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: id, Region: region,
			State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	spec := store.ServiceSpec{Command: []string{"x"}}
	two := 2
	m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": spec, "api": {Command: []string{"y"}, Replicas: &two}}}
	// The live commit runs web on a1 (ams) and n1 (nyc).
	web2 := spec
	web2.Replicas = &two
	m.Services["web"] = web2
	live := &store.DeployCommit{ID: "d1", Namespace: "ns", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": web2}},
		Slots: []store.SlotAssignment{
			{Service: "web", Slot: 0, InstanceID: "w0", Machine: "a1", Revision: 1, SpecHash: manifest.SpecHash(web2)},
			{Service: "web", Slot: 1, InstanceID: "w1", Machine: "n1", Revision: 1, SpecHash: manifest.SpecHash(web2)},
		}}
	if _, err := s.AppendCommit(ctx, live); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"w0", "w1"} {
		if _, err := s.PutInstance(ctx, &store.InstanceRecord{Version: store.RecordVersion, ID: id, Namespace: "ns", Service: "web", Slot: i,
			Revision: 1, Machine: live.Slots[i].Machine, Address: "127.0.0.1", Port: 9000 + i, State: store.InstanceReady}); err != nil {
			t.Fatal(err)
		}
	}
	set := func(region, state string) {
		t.Helper()
		if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: region, State: state}); err != nil {
			t.Fatal(err)
		}
	}
	set("ams", store.RegionDraining)
	set("nyc", store.RegionDisabled)
	d := New(s, Options{})
	p, err := d.Preview(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	var where []string
	for _, a := range p.Actions {
		switch {
		case a.Action == ActionKeep && a.InstanceID == "w0" && a.Machine == "a1":
			// a draining region keeps what it runs
		case a.Action == ActionStart && (a.Machine == "f1" || a.Machine == "f2"):
			where = append(where, a.Service)
			if a.Service == "web" && (a.Slot != 1 || !strings.Contains(a.Reason, "machine n1 disabled or removed (or its region nyc disabled)")) {
				t.Errorf("web started anew: %+v", a)
			}
		case a.Action == ActionStop && a.InstanceID == "w1":
		default:
			t.Errorf("unexpected action %+v", a)
		}
	}
	if strings.Join(where, ",") != "api,api,web" {
		t.Fatalf("started in fra: %v; want both api slots and web's nyc slot: %+v", where, p.Actions)
	}

	// Enabled again, ams and nyc take new instances (four api slots
	// spread over every machine).
	set("ams", store.RegionActive)
	set("nyc", store.RegionActive)
	four := 4
	m.Services["api"] = store.ServiceSpec{Command: []string{"y"}, Replicas: &four}
	if p, err = d.Preview(ctx, m); err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, a := range p.Actions {
		if a.Service == "api" {
			on[a.Machine] = true
		}
		if a.Service == "web" && a.Action != ActionKeep {
			t.Errorf("web after enable: %+v", a)
		}
	}
	if len(on) != 4 {
		t.Fatalf("api placed on %v, want every machine", on)
	}
}

// A manifest naming a region no machine is in and no record names, in
// locality.order or placement.regions, is refused by preview and apply
// with the known regions and the field; the apply writes nothing: no
// status, no commit, no lease.
func TestApplyRefusesAnUnknownRegion(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "f1", Region: "fra",
		State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	// ams has no machine but a record: known.
	if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: "ams", State: store.RegionDraining}); err != nil {
		t.Fatal(err)
	}
	d := New(s, Options{})
	for _, tc := range []struct {
		spec  store.ServiceSpec
		field string
	}{
		{store.ServiceSpec{Command: []string{"x"}, Locality: &store.Locality{Order: []string{"ams", "nyc"}}}, "services.web.locality.order[1]"},
		{store.ServiceSpec{Command: []string{"x"}, Placement: store.Placement{Regions: []string{"fra", "sfo"}}}, "services.web.placement.regions[1]"},
	} {
		m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": tc.spec}}
		_, perr := d.Preview(ctx, m)
		_, aerr := d.Apply(ctx, m)
		for what, err := range map[string]error{"preview": perr, "apply": aerr} {
			se := store.AsError(err)
			if se == nil || se.Code != store.CodeInvalid || !strings.Contains(se.Message, "(known regions: ams, fra)") || se.Detail["field"] != tc.field {
				t.Fatalf("%s of %s: %v (%+v), want invalid naming ams, fra and the field", what, tc.field, err, se)
			}
		}
	}
	if sts, err := d.Statuses(ctx, "ns"); err != nil || len(sts) != 0 {
		t.Fatalf("statuses after refused applies: %+v %v", sts, err)
	}
	if _, err := s.LiveCommit(ctx, "ns"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a commit after refused applies: %v", err)
	}
	if h, err := s.LockHolder(ctx, store.DeployLockKey("ns")); err == nil && h != nil {
		t.Fatalf("a lease holder after refused applies: %+v", h)
	}
	// Known regions pass.
	m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": {Command: []string{"x"},
		Locality: &store.Locality{Order: []string{"ams", "fra"}}, Placement: store.Placement{Regions: []string{"fra"}}}}}
	if _, err := d.Preview(ctx, m); err != nil {
		t.Fatalf("preview with known regions: %v", err)
	}
}
