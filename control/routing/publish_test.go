package routing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A commit's routing goes out as one routing batch while every live
// gateway reads batches, and as one message per service while one that
// does not (generation 6) is live: a fallback, not a refusal. Either way a
// cold start reads the same services.
func TestPublishBatchesUnlessAnOlderGatewayIsLive(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	evs := func(deploy string) []store.RoutingEvent {
		var out []store.RoutingEvent
		for i := range 5 {
			out = append(out, store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "shop", Service: fmt.Sprintf("s%d", i), DeployID: deploy})
		}
		return out
	}
	published := func(deploy string) (parts, single int) {
		t.Helper()
		info, err := storetest.Stream(t, s, s.Names.RoutingEventsStream()).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := routing.Publish(ctx, s, deploy, "shop", evs(deploy)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadFrom(ctx, s.Names.RoutingEventsStream(), info.State.LastSeq+1, "", func(m *store.StoredMsg) error {
			switch {
			case s.IsBatchPart(m):
				parts++
			case !s.IsSeal(m):
				single++
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		st, err := s.LoadRouting(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Services) != 5 || st.Services[0].DeployID != deploy || st.Services[4].DeployID != deploy {
			t.Fatalf("after %s, a cold start reads %+v", deploy, st.Services)
		}
		return parts, single
	}
	if parts, single := published("d1"); parts != 1 || single != 0 {
		t.Fatalf("no older gateway live: %d parts, %d single events; want one batch part", parts, single)
	}
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.42.0", Generation: store.GenerationBatches - 1, At: time.Now().UTC()}
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.GatewaysBucket()), store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	if parts, single := published("d2"); parts != 0 || single != 5 {
		t.Fatalf("a 0.42.0 gateway live: %d parts, %d single events; want 5 single events", parts, single)
	}
	// Upgraded, it reads batches again.
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if parts, single := published("d3"); parts != 1 || single != 0 {
		t.Fatalf("the gateway upgraded: %d parts, %d single events", parts, single)
	}
}

// A canary step's batch holds every service the namespace routes: the
// services only the live commit has too, as live routes them, since a
// cold start takes the batch as the namespace's whole state.
func TestCanaryBatchHoldsTheLiveOnlyServices(t *testing.T) {
	live := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}, "gone": {}}}}
	cp := &store.DeployCommit{ID: "d2", Namespace: "shop", Kind: store.CommitCheckpoint, Phase: "canary-1", Revision: 2,
		Canary:   &store.Canary{Step: 1, Weight: 10},
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}, "new": {}}}}
	src := &routing.Source{}
	got := map[string]string{}
	for _, ev := range routing.CanaryBatch(cp, live, src) {
		got[ev.Service] = ev.DeployID
	}
	if len(got) != 3 || got["gone"] != "d1" || got["new"] != "d2" || got["web"] == "" {
		t.Fatalf("canary batch: %v", got)
	}
	if n := len(routing.CanaryEvents(cp, live, src)); n != 2 {
		t.Fatalf("CanaryEvents: %d events, want 2 (web, new)", n)
	}
}
