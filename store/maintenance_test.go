package store_test

import (
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Maintenance travels as a signed routing event: the last record per
// namespace or service, on or off, is what MaintenanceRecords and
// LoadRouting read; a malformed one is refused before anything is
// published, and one filed on another subject does not verify.
func TestMaintenanceRecords(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	if got, err := s.MaintenanceRecords(ctx); err != nil || len(got) != 0 {
		t.Fatalf("none set: %v %v", got, err)
	}
	for _, r := range []store.MaintenanceRecord{
		{Namespace: "shop", On: true, Message: "upgrading", RetryAfter: store.Duration(2 * time.Minute), By: "ops"},
		{Namespace: "shop", Service: "api", On: true},
		{Namespace: "shop", Service: "api", On: false},
	} {
		if _, err := s.SetMaintenance(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []store.MaintenanceRecord{{On: true}, {Namespace: "a.b", On: true}, {Namespace: "shop", Service: "_", On: true}, {Namespace: "shop", Service: "x y"}} {
		if _, err := s.SetMaintenance(ctx, bad); err == nil {
			t.Errorf("%+v published", bad)
		}
	}
	got, err := s.MaintenanceRecords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Service != "" || !got[0].On || got[0].Message != "upgrading" ||
		got[0].RetryAfter != store.Duration(2*time.Minute) || got[1].Service != "api" || got[1].On {
		t.Fatalf("MaintenanceRecords = %+v", got)
	}
	rs, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Maintenance) != 2 || rs.Maintenance[0].Service != "" || rs.Maintenance[1].Service != "api" || len(rs.Skipped) != 0 {
		t.Fatalf("LoadRouting maintenance = %+v, skipped %v", rs.Maintenance, rs.Skipped)
	}
	ns, svc, ok := s.Names.RoutingMaintenanceOf(s.Names.RoutingMaintenanceSubject("shop", ""))
	if !ok || ns != "shop" || svc != "" {
		t.Fatalf("RoutingMaintenanceOf(whole) = %q %q %v", ns, svc, ok)
	}
	if ns, svc, ok = s.Names.RoutingMaintenanceOf(s.Names.RoutingMaintenanceSubject("shop", "api")); !ok || ns != "shop" || svc != "api" {
		t.Fatalf("RoutingMaintenanceOf(api) = %q %q %v", ns, svc, ok)
	}
	ev := store.RoutingEvent{Kind: store.EventMaintenanceUpsert, Maintenance: &store.MaintenanceRecord{Namespace: "shop", On: true}}
	if err := ev.SubjectOK(s.Names, s.Names.RoutingMaintenanceSubject("shop", "api")); err == nil {
		t.Fatal("a whole namespace's record filed on a service's subject passed SubjectOK")
	}
	if err := ev.SubjectOK(s.Names, s.Names.RoutingMaintenanceSubject("shop", "")); err != nil {
		t.Fatal(err)
	}
}
