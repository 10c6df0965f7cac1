package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/control/rollout"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// announceServer plants control server name's announcement at release, as
// a control server of that release writes it.
func announceServer(t *testing.T, s *store.Store, name, release string) {
	t.Helper()
	data, err := json.Marshal(store.ServerRecord{Version: store.RecordVersion, Name: name, Release: release, Generation: store.SchemaGeneration,
		StartedAt: time.Now().UTC(), At: time.Now().UTC(), Interval: store.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storetest.Bucket(t, s, s.Names.MetaBucket()).Put(context.Background(), store.ServerKey(name), data); err != nil {
		t.Fatal(err)
	}
}

// A fleet upgrade refuses, before any machine is told anything, a release
// that skips a minor release for a machine and one ahead of the control
// plane's lowest release; a release the policy allows goes through.
func TestRolloutKeepsToTheSkewPolicy(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fleet, err := fleetsim.Start(ctx, srv.Connect(t), fleetsim.Config{Machines: 3, Release: "0.38.2"})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()
	for _, rel := range []string{"0.39.0", "0.40.0", "1.0.0"} {
		if err := srv.Store.PushRelease(ctx, &store.ReleaseRecord{Release: rel, Arch: version.Arch()},
			map[string]io.Reader{"control": bytes.NewReader([]byte("binary " + rel))}); err != nil {
			t.Fatal(err)
		}
	}
	announceServer(t, srv.Store, "cp1", "0.40.0")
	announceServer(t, srv.Store, "cp2", "0.39.0")
	for _, c := range []struct{ release, says string }{
		{"0.40.0", "release 0.40.0 is ahead of the control plane (its lowest control server runs 0.39.0)"},
		{"1.0.0", "ahead of the control plane"},
	} {
		_, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: c.release})
		if !store.HasCode(err, store.CodeVersionSkew) || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("rollout to %s: %v, want version_skew saying %q", c.release, err, c.says)
		}
	}
	announceServer(t, srv.Store, "cp2", "1.0.0")
	announceServer(t, srv.Store, "cp1", "1.0.0")
	_, err = rollout.Run(ctx, srv.Store, rollout.Options{Release: "0.40.0"})
	if !store.HasCode(err, store.CodeVersionSkew) || !strings.Contains(err.Error(), "skips a minor release for") || !strings.Contains(err.Error(), "(0.38.2)") {
		t.Fatalf("rollout 0.38.2 → 0.40.0: %v, want version_skew naming the machines", err)
	}
	if got := fleet.Releases(); got["0.38.2"] != 3 {
		t.Fatalf("refused rollouts changed the fleet: %v", got)
	}
	res, err := rollout.Run(ctx, srv.Store, rollout.Options{Release: "0.39.0", HealthBound: 30 * time.Second})
	if err != nil || len(res.Upgraded) != 3 {
		t.Fatalf("rollout 0.38.2 → 0.39.0: %+v, %v", res, err)
	}
	if res, err = rollout.Run(ctx, srv.Store, rollout.Options{Release: "0.40.0", HealthBound: 30 * time.Second}); err != nil || len(res.Upgraded) != 3 {
		t.Fatalf("rollout 0.39.0 → 0.40.0: %+v, %v", res, err)
	}
}
