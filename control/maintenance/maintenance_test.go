package maintenance

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// liveDeploy stores a final commit of namespace ns naming services, as a
// deploy leaves one.
func liveDeploy(t *testing.T, s *store.Store, ns string, services ...string) {
	t.Helper()
	m := store.Manifest{Namespace: ns, Services: map[string]store.ServiceSpec{}}
	for _, svc := range services {
		m.Services[svc] = store.ServiceSpec{Command: []string{"true"}}
	}
	c := &store.DeployCommit{ID: "d-" + ns, Namespace: ns, Kind: store.CommitFinal, Revision: 1, Manifest: m, CreatedAt: time.Now().UTC()}
	if _, err := s.AppendCommit(t.Context(), c); err != nil {
		t.Fatal(err)
	}
}

// An unknown namespace or service is a not_found naming what exists, and
// nothing is published; on, on again (a no-op), a service's own off
// under its namespace's on, and off where nothing is on (a no-op) each
// publish what they say.
func TestSet(t *testing.T) {
	srv := storetest.Start(t)
	ctx := t.Context()
	s := srv.Store
	liveDeploy(t, s, "shop", "web", "api")
	head := func() uint64 {
		info, err := s.RoutingInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before := head()
	for _, tc := range []struct{ ns, svc, says string }{
		{"blog", "", `unknown namespace "blog": no live deploy (namespaces: shop)`},
		{"shop", "db", `namespace shop has no service "db" (services: api, web)`},
	} {
		_, err := Set(ctx, s, Request{Namespace: tc.ns, Service: tc.svc, On: true})
		if se := store.AsError(err); se == nil || se.Code != store.CodeNotFound || se.Message != tc.says {
			t.Errorf("on %s %s: %v, want not_found %q", tc.ns, tc.svc, err, tc.says)
		}
	}
	if head() != before {
		t.Fatalf("a refused change published: routing head %d, was %d", head(), before)
	}

	ch, err := Set(ctx, s, Request{Namespace: "shop", On: true, Message: "back soon"})
	if err != nil || !ch.Changed || ch.Previous || ch.Seq != head() || time.Duration(ch.Record.RetryAfter) != DefaultRetryAfter || ch.Record.By == "" {
		t.Fatalf("on shop: %+v %v", ch, err)
	}
	at := head()
	if ch, err = Set(ctx, s, Request{Namespace: "shop", On: true, Message: "back soon"}); err != nil || ch.Changed || !ch.Previous || head() != at {
		t.Fatalf("on shop again: %+v %v, head %d (was %d)", ch, err, head(), at)
	}
	if ch, err = Set(ctx, s, Request{Namespace: "shop", Service: "api", On: false}); err != nil || !ch.Changed || !ch.Previous {
		t.Fatalf("off shop/api under shop's on: %+v %v", ch, err)
	}
	recs, err := s.MaintenanceRecords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, on := Effective(recs, "shop", "web"); !on {
		t.Errorf("shop/web is not under maintenance: %+v", recs)
	}
	if _, on := Effective(recs, "shop", "api"); on {
		t.Errorf("shop/api is under maintenance after its own off: %+v", recs)
	}
	if ch, err = Set(ctx, s, Request{Namespace: "shop", On: false}); err != nil || !ch.Changed || !ch.Previous {
		t.Fatalf("off shop: %+v %v", ch, err)
	}
	at = head()
	if ch, err = Set(ctx, s, Request{Namespace: "shop", Service: "web", On: false}); err != nil || ch.Changed || head() != at {
		t.Fatalf("off shop/web with nothing on: %+v %v", ch, err)
	}
}

// Maintenance is not published while a live gateway runs a generation
// before edge protection (it would refuse the event and keep proxying):
// version_skew naming it, nothing published; once it reports a current
// release, it is.
func TestSetRefusedWhileAGatewayCannotServeMaintenance(t *testing.T) {
	srv := storetest.Start(t)
	ctx := t.Context()
	s := srv.Store
	liveDeploy(t, s, "shop", "web")
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.41.0", Generation: store.GenerationEdge - 1, At: time.Now().UTC()}
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.GatewaysBucket()), store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	_, err := Set(ctx, s, Request{Namespace: "shop", On: true})
	if se := store.AsError(err); se == nil || se.Code != store.CodeVersionSkew || !strings.Contains(se.Message, "gw-old (0.41.0)") ||
		!strings.Contains(se.Message, store.FirstReleaseOf(store.GenerationEdge)) {
		t.Fatalf("on with a 0.41.0 gateway live: %v", err)
	}
	if recs, err := s.MaintenanceRecords(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("after the refusal: %v %v", recs, err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if ch, err := Set(ctx, s, Request{Namespace: "shop", On: true}); err != nil || !ch.Changed {
		t.Fatalf("on with every gateway current: %+v %v", ch, err)
	}
}
