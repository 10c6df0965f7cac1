package projection

import (
	"path/filepath"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

func maintenanceEvent(ns, svc string, on bool, msg string) *store.RoutingEvent {
	return &store.RoutingEvent{Version: 1, Kind: store.EventMaintenanceUpsert,
		Maintenance: &store.MaintenanceRecord{Namespace: ns, Service: svc, On: on, Message: msg}}
}

// A service's own record decides for it, else its namespace's; off is
// kept as a record; the records survive a snapshot and a rebuild from
// the stored state.
func TestViewMaintenance(t *testing.T) {
	b := newBuilder(emptyView(false))
	for i, ev := range []*store.RoutingEvent{
		maintenanceEvent("shop", "", true, "whole"),
		maintenanceEvent("shop", "api", false, ""),
		maintenanceEvent("blog", "web", true, "web only"),
		maintenanceEvent("blog", "web", true, "web again"),
	} {
		if err := b.apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if err := b.apply(&store.RoutingEvent{Kind: store.EventMaintenanceUpsert}); err == nil {
		t.Fatal("a maintenance upsert without a record applied")
	}
	v := b.finish(4, false)
	check := func(v *View) {
		t.Helper()
		cases := []struct {
			ns, svc string
			on      bool
			msg     string
		}{
			{"shop", "web", true, "whole"},
			{"shop", "api", false, ""},
			{"blog", "web", true, "web again"},
			{"blog", "db", false, ""},
			{"other", "web", false, ""},
		}
		for _, c := range cases {
			r, on := v.Maintenance(c.ns, c.svc)
			if on != c.on || (on && r.Message != c.msg) {
				t.Errorf("Maintenance(%s, %s) = %+v %v, want on %v %q", c.ns, c.svc, r, on, c.on, c.msg)
			}
		}
		if recs := v.MaintenanceRecords(); len(recs) != 3 || recs[0].Namespace != "blog" || recs[1].Service != "" || recs[2].Service != "api" {
			t.Errorf("MaintenanceRecords = %+v", recs)
		}
	}
	check(v)
	snap := filepath.Join(t.TempDir(), "routing.json")
	if err := writeSnapshot(snap, v); err != nil {
		t.Fatal(err)
	}
	loaded, err := loadSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	check(loaded)
	rebuilt, errs := FromState(&store.RoutingState{Seq: 4, Maintenance: v.MaintenanceRecords()})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	check(rebuilt)
	// Taking the namespace out leaves a service's own on alone.
	b = newBuilder(v)
	if err := b.apply(maintenanceEvent("blog", "", false, "")); err != nil {
		t.Fatal(err)
	}
	if _, on := b.finish(5, false).Maintenance("blog", "web"); !on {
		t.Error("a namespace's off ended a service's own maintenance")
	}
}

// A request's maintenance lookup allocates nothing, with records set or
// not.
func TestMaintenanceLookupAllocatesNothing(t *testing.T) {
	b := newBuilder(emptyView(false))
	if err := b.apply(maintenanceEvent("shop", "api", true, "")); err != nil {
		t.Fatal(err)
	}
	v := b.finish(1, false)
	if n := testing.AllocsPerRun(100, func() { v.Maintenance("blog", "web") }); n != 0 {
		t.Fatalf("%v allocations per lookup", n)
	}
}
