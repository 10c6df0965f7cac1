package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// `control status` shows every known region (of machines, gateways,
// traffic and region states) with its state and who set it, what runs
// there and the traffic it serves and crosses; the JSON carries the same.
// A region event that does not verify is said, and the rest still shows.
func TestStatusShowsRegions(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := srv.Store
	now := time.Now().UTC()
	for id, region := range map[string]string{"m1": "fra", "m2": "fra", "m3": "tyo", "m4": ""} {
		if err := s.PutMachine(ctx, &store.MachineRecord{ID: id, Region: region, State: store.MachineActive, Address: "10.0.0.1", JoinedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	for gw, region := range map[string]string{"gw-fra": "fra", "gw-tyo": "tyo"} {
		if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: gw, Region: region, AppliedSeq: 1, At: now}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: "tyo", State: store.RegionDraining, By: "ops"}); err != nil {
		t.Fatal(err)
	}
	// A region only a state names (no machine there yet) is known too.
	if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: "nyc", State: store.RegionDisabled}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNamespaceStatus(ctx, &store.NamespaceStatus{Namespace: "shop", Counts: store.Counts{Ready: 3, Starting: 1},
		Machines: map[string]store.Counts{"m1": {Ready: 2}, "m3": {Ready: 1, Starting: 1}},
		Traffic: map[string]store.ServiceTrafficStatus{"web": {Regions: map[string]store.RegionTraffic{
			"fra": {Served: 900, ServedRate: 30, Arrived: 600, ArrivedRate: 20},
			"tyo": {Served: 100, ServedRate: 5, Arrived: 400, ArrivedRate: 15, Crossed: 300, CrossedRate: 12},
		}}}, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}

	f, err := status.ReadFleet(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	f.WriteText(&b)
	text := b.String()
	for _, want := range []string{
		"REGION  STATE              MACHINES  GATEWAYS  INSTANCES  SERVED REQ/S  ARRIVED REQ/S  CROSSED\n",
		"fra     active             2         1         2/2 ready  30.0          20.0           0.0%\n",
		"nyc     disabled           0         0         0/0 ready  0.0           0.0            0.0%\n",
		"tyo     draining (by ops)  1         1         1/2 ready  5.0           15.0           80.0%\n",
		"(none)  -                  1         0         0/0 ready  0.0           0.0            0.0%\n",
		"  gw-tyo in tyo at 1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("fleet status lacks %q:\n%s", want, text)
		}
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Regions []status.Region `json:"regions"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Regions) != 4 || back.Regions[2].Name != "tyo" || back.Regions[2].By != "ops" || back.Regions[2].CrossShare != 0.8 ||
		back.Regions[2].Traffic.Crossed != 300 || back.Regions[3].Name != "" {
		t.Errorf("regions in the JSON: %+v", back.Regions)
	}

	// An unsigned region event: its state cannot be trusted, which the
	// status says, and the rest still shows.
	subj := s.Names.RoutingRegionSubject("fra")
	body, _ := json.Marshal(store.RoutingEvent{Version: 1, Kind: store.EventRegionUpsert, Region: &store.RegionRecord{Name: "fra", State: store.RegionDisabled}})
	if _, err := s.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: body}); err != nil {
		t.Fatal(err)
	}
	if f, err = status.ReadFleet(ctx, s); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	f.WriteText(&b)
	if !strings.Contains(f.RegionsUnreadable, "reading region states") || !strings.Contains(b.String(), "region states unreadable: reading region states") ||
		len(f.Regions) != 3 {
		t.Errorf("an unverifiable region event: %q, %+v\n%s", f.RegionsUnreadable, f.Regions, b.String())
	}

	// A namespace on very many machines lists only those with instances
	// not ready: the ready counts by region are partial, and say so.
	if err := s.PutNamespaceStatus(ctx, &store.NamespaceStatus{Namespace: "big", Counts: store.Counts{Ready: 1000, Failed: 1},
		Machines: map[string]store.Counts{"m3": {Failed: 1}}, MachinesTrimmed: true, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if f, err = status.ReadFleet(ctx, s); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	f.WriteText(&b)
	if !strings.Contains(b.String(), "1/3 ready (partial)") || !f.Regions[0].Partial {
		t.Errorf("a trimmed summary's regions:\n%s", b.String())
	}
}
