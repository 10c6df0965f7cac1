package deploy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A manifest with error pages is refused, naming the old gateways and the
// fields, while a gateway before edge protection is live; once it is
// upgraded the manifest passes.
func TestErrorPagesRefusedWhileAGatewayIsTooOld(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.41.0", Generation: store.GenerationEdge - 1, At: time.Now().UTC()}
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.GatewaysBucket()), store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	paged := &store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"web"}, Routes: []store.Route{{Hosts: []string{"a.example"}},
			{Hosts: []string{"b.example"}, ErrorPages: map[int]store.ErrorPage{503: {Body: "busy"}}}}},
	}}
	d := New(s, Options{})
	_, err := d.Preview(ctx, paged)
	if se := store.AsError(err); se == nil || se.Code != store.CodeVersionSkew ||
		!strings.Contains(se.Message, "gateways gw-old (0.41.0) cannot serve error pages (release 0.42.0 or later can)") ||
		se.Detail["fields"] != "services.web.routes[1].error_pages" {
		t.Fatalf("with a 0.41.0 gateway live: %v", err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Preview(ctx, paged); err != nil {
		t.Fatalf("every gateway current: %v", err)
	}
}
