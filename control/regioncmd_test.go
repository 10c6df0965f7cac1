package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/regions"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// control region, against a real store: an unknown region is a clear
// error naming the known ones and publishes nothing; drain stores one
// signed region event (its sequence in the JSON) that `region ls` and
// the routing state show; draining again is a no-op that says so;
// enable brings it back.
func TestRegionCommands(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	for id, region := range map[string]string{"m1": "fra", "m2": "fra", "m3": "ams", "m4": ""} {
		if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: id, Region: region,
			State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-fra", Region: "fra", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--nats", srv.URL, "--signing-key", srv.SignerFile())...)
	}
	head := func() uint64 {
		info, err := s.RoutingInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}

	before := head()
	code, _, errOut := cli("region", "drain", "nyc")
	if code != 1 || !strings.Contains(errOut, `error: invalid: unknown region "nyc" (known regions: ams, fra)`) || !strings.Contains(errOut, "region: nyc") {
		t.Fatalf("drain of an unknown region: exit %d, stderr %q", code, errOut)
	}
	if head() != before {
		t.Fatalf("an unknown region published: routing head %d, was %d", head(), before)
	}

	code, out, errOut := cli("region", "drain", "fra", "-o", "json")
	var ch regions.Change
	if code != 0 || json.Unmarshal([]byte(out), &ch) != nil {
		t.Fatalf("drain fra: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !ch.Changed || ch.Previous != store.RegionActive || ch.Region.State != store.RegionDraining || ch.Seq == 0 || ch.Seq != head() || ch.Region.By == "" {
		t.Fatalf("drain fra: %+v (routing head %d)", ch, head())
	}
	recs, err := s.RegionRecords(ctx)
	if err != nil || recs["fra"].State != store.RegionDraining {
		t.Fatalf("region records after drain: %v %v", recs, err)
	}
	st, err := s.LoadRouting(ctx)
	if err != nil || len(st.Regions) != 1 || st.Regions[0].State != store.RegionDraining {
		t.Fatalf("routing state after drain: %+v %v", st, err)
	}

	at := head()
	code, out, _ = cli("region", "drain", "fra")
	if code != 0 || out != "region fra is already draining; nothing changed\n" || head() != at {
		t.Fatalf("drain again: exit %d, %q, head %d (was %d)", code, out, head(), at)
	}

	code, out, errOut = runCLI(t, "region", "ls", "--nats", srv.URL, "-o", "json")
	var list regions.List
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("region ls: exit %d, %q %q", code, out, errOut)
	}
	if len(list) != 2 || list[0].Name != "ams" || list[0].State != store.RegionActive || list[0].Machines[store.MachineActive] != 1 ||
		list[1].Name != "fra" || list[1].State != store.RegionDraining || list[1].Machines[store.MachineActive] != 2 ||
		list[1].By != ch.Region.By || strings.Join(list[1].Gateways, ",") != "gw-fra" || len(list[0].Gateways) != 0 {
		t.Fatalf("region ls: %+v", list)
	}
	code, out, _ = runCLI(t, "regions", "ls", "--nats", srv.URL)
	if code != 0 || !strings.Contains(out, "REGION") || !strings.Contains(out, "fra     draining") || !strings.Contains(out, "2 active") {
		t.Fatalf("region ls as text: exit %d\n%s", code, out)
	}

	code, out, _ = cli("region", "enable", "fra")
	if code != 0 || !strings.Contains(out, "region fra is active (was draining)") {
		t.Fatalf("enable fra: exit %d, %q", code, out)
	}
	if recs, err := s.RegionRecords(ctx); err != nil || recs["fra"].State != store.RegionActive {
		t.Fatalf("region records after enable: %v %v", recs, err)
	}
	// --wait: the one gateway has not applied the change (it reports
	// sequence 0), then one that has.
	code, out, _ = cli("region", "disable", "ams", "--wait", "300ms", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &ch) != nil || ch.Gateways != "0/1" || strings.Join(ch.Laggards, ",") != "gw-fra" {
		t.Fatalf("disable ams --wait with a gateway behind: exit %d, %q", code, out)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-fra", Region: "fra", AppliedSeq: 1 << 40, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = cli("region", "enable", "ams", "--wait", "5s")
	if code != 0 || !strings.Contains(out, "1/1 gateways applied it") || strings.Contains(out, "warning") {
		t.Fatalf("enable ams --wait with the gateway caught up: exit %d, %q", code, out)
	}
	// A CLI without a signer key cannot publish a region state.
	code, _, errOut = runCLI(t, "region", "disable", "ams", "--nats", srv.URL)
	if code != 1 || !strings.Contains(errOut, "signing_key_required") {
		t.Fatalf("disable without a signer key: exit %d, %q", code, errOut)
	}
}
