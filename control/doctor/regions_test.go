package doctor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Doctor on regions: a region out of service is a note; a gateway in a
// region without an instance of a strict service (it answers 503) and a
// gateway without a region in a fleet whose machines have regions are
// warnings; a region state event that does not verify is a problem, said
// once, in the regions layer.
func TestDoctorRegions(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := srv.Store
	now := time.Now().UTC()
	for _, m := range []store.MachineRecord{
		{ID: "m1", Region: "fra", Address: "127.0.0.1"},
		{ID: "m2", Region: "tyo", Address: "127.0.0.2"},
	} {
		m.State, m.JoinedAt, m.UpdatedAt = store.MachineActive, now, now
		if err := s.PutMachine(ctx, &m); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: &m, At: now}}); err != nil {
			t.Fatal(err)
		}
	}
	routes := []store.Route{{Hosts: []string{"web.test"}}}
	c, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{
		"web": {Routes: routes, Instances: []storetest.Instance{{ID: "w1", Machine: "m1", Address: "127.0.0.1", Port: 9001}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// web serves its own region only.
	if _, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		DeployID: c.ID, Revision: c.Revision, Routes: routes, Locality: &store.Locality{Policy: store.LocalityStrict}, At: now,
		Endpoints: []store.Endpoint{{InstanceID: "w1", Machine: "m1", Slot: 0, Revision: c.Revision, Address: "127.0.0.1", Port: 9001}}}}); err != nil {
		t.Fatal(err)
	}
	for gw, region := range map[string]string{"gw-fra": "fra", "gw-tyo": "tyo", "gw-bare": ""} {
		if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: gw, Region: region, AppliedSeq: 1, At: now}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []store.RegionRecord{{Name: "tyo", State: store.RegionDraining, By: "ops"}, {Name: "sgp", State: store.RegionDisabled}} {
		if _, err := s.SetRegionState(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// fra's state, unsigned.
	body, _ := json.Marshal(store.RoutingEvent{Version: 1, Kind: store.EventRegionUpsert, Region: &store.RegionRecord{Name: "fra", State: store.RegionDisabled}})
	if _, err := s.JS.PublishMsg(ctx, &nats.Msg{Subject: s.Names.RoutingRegionSubject("fra"), Data: body}); err != nil {
		t.Fatal(err)
	}

	rep, err := doctor.Run(ctx, s, doctor.Options{ProbeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var regions []doctor.Finding
	for _, f := range rep.Findings {
		if f.Layer == doctor.LayerRegions {
			regions = append(regions, f)
		}
		if f.Layer == doctor.LayerRouting && strings.Contains(f.Subject, "region") {
			t.Errorf("the unverified region event found again in the routing layer: %+v", f)
		}
	}
	want := []struct{ severity, subject, message string }{
		{doctor.Problem, "region fra", "its state event (sequence "},
		{doctor.Warning, "gateway gw-bare", "has no region while the machines are in fra, tyo: it serves every region alike"},
		{doctor.Warning, "gateway gw-tyo", "serves shop/web, whose locality is strict, in region tyo, which has no instance there: it answers 503 for it"},
		{doctor.Note, "region sgp", "disabled (set at "},
		{doctor.Note, "region tyo", "draining (set by ops at "},
	}
	if len(regions) != len(want) {
		t.Fatalf("region findings: %+v", regions)
	}
	for i, w := range want {
		f := regions[i]
		if f.Severity != w.severity || f.Subject != w.subject || !strings.Contains(f.Message, w.message) {
			t.Errorf("finding %d = %+v, want %s %s %q", i, f, w.severity, w.subject, w.message)
		}
	}
	if rep.Coherent || rep.Checked[doctor.LayerRegions] != 3 { // fra, sgp, tyo: fra's record is not trusted, its machine is
		t.Errorf("coherent %v, checked %v", rep.Coherent, rep.Checked)
	}
	var b bytes.Buffer
	printers.Doctor(&b, rep)
	if !strings.Contains(b.String(), "warning   regions   gateway gw-tyo") || !strings.Contains(b.String(), " regions 3)") {
		t.Errorf("doctor's text:\n%s", b.String())
	}
}
