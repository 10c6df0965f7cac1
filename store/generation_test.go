package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A process that announced no generation is taken at the oldest it may
// be: a release of v0.38.0 read observations (generation 2); anything
// else, "dev" and no release among it, is taken as generation 1.
func TestGenerationOfTheUnannounced(t *testing.T) {
	for _, c := range []struct {
		announced int
		release   string
		want      int
	}{
		{3, "0.39.0", 3},
		{3, "dev", 3},
		{0, "0.38.0", 2},
		{0, "0.38.4", 2},
		{0, "0.37.9", 1},
		{0, "dev", 1},
		{0, "", 1},
	} {
		if got := store.GenerationOf(c.announced, c.release); got != c.want {
			t.Errorf("GenerationOf(%d, %q) = %d, want %d", c.announced, c.release, got, c.want)
		}
	}
}

// The floor rises and never goes down; a process below it is refused with
// a too_old error naming the release the store needs, one at or above it
// is let in, and a store with no floor refuses nobody.
func TestFloorRisesAndRefusesProcessesBelowIt(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	if err := s.CheckFloor(ctx, "agent"); err != nil {
		t.Fatalf("no floor: %v", err)
	}
	f, err := s.RaiseFloor(ctx, 2, "control server a (0.39.0)")
	if err != nil {
		t.Fatal(err)
	}
	if f.MinGeneration != 2 || f.MinRelease != "0.38.0" || f.SetBy != "control server a (0.39.0)" {
		t.Fatalf("raised floor: %+v", f)
	}
	if f, err = s.RaiseFloor(ctx, 1, "control server b (0.37.0)"); err != nil || f.MinGeneration != 2 {
		t.Fatalf("lowering the floor: %+v, %v; want it kept at 2", f, err)
	}
	if err := s.CheckFloor(ctx, "agent"); err != nil {
		t.Fatalf("floor 2, generation %d: %v", store.SchemaGeneration, err)
	}
	err = store.TooOld(f, "control", 1, "0.37.0")
	if !store.HasCode(err, store.CodeTooOld) || !strings.Contains(err.Error(), "this store needs edgeplane >= 0.38.0 (schema generation 2); this is control 0.37.0") {
		t.Fatalf("generation 1 on floor 2: %v", err)
	}

	storetest.FutureFloor(t, s, 99, "9.0.0")
	err = s.CheckFloor(ctx, "agent")
	if !store.HasCode(err, store.CodeTooOld) || !strings.Contains(err.Error(), "needs edgeplane >= 9.0.0 (schema generation 99); this is agent "+version.Version) {
		t.Fatalf("floor 99: %v, want too_old naming 9.0.0", err)
	}
}

// A control server's announcement is filed under its name, says what
// this build is, and is fresh for three of its intervals.
func TestServerRecords(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	started := time.Now().UTC()
	if err := s.PutServerRecord(ctx, "box.example", started, time.Second); err != nil {
		t.Fatal(err)
	}
	var got []store.ServerRecord
	if err := s.ListServerRecords(ctx, func(r *store.ServerRecord) error {
		got = append(got, *r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "box.example" || got[0].Release != version.Version || got[0].Generation != store.SchemaGeneration {
		t.Fatalf("server records: %+v", got)
	}
	if !got[0].Fresh(time.Now()) || got[0].Fresh(time.Now().Add(4*time.Second)) {
		t.Errorf("freshness of %+v: want fresh now, not after 4 intervals", got[0])
	}
}

// Agents, gateways and meshd announce their release and generation in
// what they already write.
func TestRecordsAnnounceReleaseAndGeneration(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	if err := s.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatal(err)
	}
	b, err := s.MachineBeatOf(ctx, "m1")
	if err != nil || b.Release != version.Version || b.Generation != store.SchemaGeneration {
		t.Errorf("machine beat: %+v, %v", b, err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw1", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		if g.Release != version.Version || g.Generation != store.SchemaGeneration {
			t.Errorf("gateway report: %+v", g)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMeshBeat(ctx, store.MeshHeartbeat{Machine: "m1", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	hb, err := s.MeshHeartbeatOf(ctx, "m1")
	if err != nil || hb.Release != version.Version || hb.Generation != store.SchemaGeneration {
		t.Errorf("mesh heartbeat: %+v, %v", hb, err)
	}
}
