package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// `control fleet versions` and `control status` show every process kind
// with the release and schema generation it announces: a process of a
// release before announcements (a v0.38.0 agent names its release only, a
// v0.38.0 gateway nothing) at the oldest generation it may be, marked
// "?", and the store's floor.
func TestVersionsShowEveryProcessKind(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := srv.Store
	if err := s.PutServerRecord(ctx, "cp1", time.Now().UTC(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMachineBeat(ctx, "m-new", time.Minute); err != nil {
		t.Fatal(err)
	}
	plant := func(bucket, key string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := storetest.Bucket(t, s, bucket).Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	plant(s.Names.MachineBeatsBucket(), "m-old", map[string]any{"version": 1, "machine": "m-old", "at": now, "interval": "1m", "release": "0.38.0"})
	plant(s.Names.GatewaysBucket(), store.GatewayKey("gw-old"), map[string]any{"version": 1, "gateway": "gw-old", "applied_seq": 1, "at": now})
	if err := s.PutMeshBeat(ctx, store.MeshHeartbeat{Machine: "m-new", At: now, Interval: store.Duration(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RaiseFloor(ctx, 2, "control server cp1 (test)"); err != nil {
		t.Fatal(err)
	}

	v, err := status.ReadVersions(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	v.WriteText(&b)
	text := b.String()
	for _, want := range []string{
		"control server  " + version.Version,
		"agent           0.38.0   2?          1: m-old",
		"agent           " + version.Version,
		"gateway         unknown  1?          1: gw-old",
		"meshd           " + version.Version,
		"store floor: schema generation 2 (edgeplane >= 0.38.0), raised by control server cp1 (test)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("fleet versions lacks %q:\n%s", want, text)
		}
	}

	f, err := status.ReadFleet(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	f.WriteText(&b)
	gen := fmt.Sprintf(" gen %d", store.SchemaGeneration)
	want := "releases: agent: 1 on 0.38.0 gen 2?, 1 on " + version.Version + gen + "; control server: 1 on " + version.Version + gen + "; gateway: 1 on unknown gen 1?; meshd: 1 on " + version.Version + gen + "\n"
	if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "store floor: schema generation 2") {
		t.Errorf("fleet status lacks %q and the floor:\n%s", want, b.String())
	}
}
