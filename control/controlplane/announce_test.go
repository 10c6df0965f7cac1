package controlplane

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The floor stays where it is while any process heard from may be below
// the generation this release's writers need (a gateway of v0.38.0
// announces nothing, so it may be generation 1), and is raised to it once
// every one announces it.
func TestFloorRisesOnlyWhenEveryProcessHeardFromIsAtIt(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := srv.Store
	old, err := json.Marshal(map[string]any{"version": 1, "gateway": "gw1", "applied_seq": 1, "at": time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.Bucket(t, s, s.Names.GatewaysBucket()).Put(ctx, store.GatewayKey("gw1"), old); err != nil {
		t.Fatal(err)
	}
	if err := s.PutServerRecord(ctx, "cp1", time.Now().UTC(), announceEvery); err != nil {
		t.Fatal(err)
	}
	if err := raiseFloor(ctx, s, "cp1", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if f, _, err := s.Floor(ctx); err != nil || f.MinGeneration != 0 {
		t.Fatalf("with a gateway that announces nothing: floor %+v, %v; want none", f, err)
	}
	// The gateway is upgraded: its report now says what it runs.
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw1", AppliedSeq: 1, At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := raiseFloor(ctx, s, "cp1", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	f, _, err := s.Floor(ctx)
	if err != nil || f.MinGeneration != store.GenerationObserved || f.MinRelease != "0.38.0" || f.SetBy == "" {
		t.Fatalf("every process announcing generation %d: floor %+v, %v", store.SchemaGeneration, f, err)
	}
}
