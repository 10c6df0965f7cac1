package deploy

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// While a gateway before edge protection is live, a manifest with a
// protected route is refused (preview and apply, nothing committed) with
// version_skew naming the gateway and each protected route by path with
// its fields; one without is not; once every gateway is current, it is
// not.
func TestProtectionRefusedWhileAGatewayIsTooOld(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()
	if err := s.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	old := &store.GatewayObservation{Version: store.RecordVersion, Gateway: "gw-old", Release: "0.41.0", Generation: 5, At: time.Now().UTC()}
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.GatewaysBucket()), store.GatewayKey(old.Gateway), old); err != nil {
		t.Fatal(err)
	}
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	hash := string(h)
	protected := &store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{
		"auth": {Command: []string{"auth"}, Routes: []store.Route{{Hosts: []string{"auth.example"}}}},
		"web": {Command: []string{"web"}, Routes: []store.Route{
			{Hosts: []string{"open.example"}},
			{Hosts: []string{"web.example"}, BasicAuth: &store.BasicAuth{Users: []store.BasicAuthUser{{Username: "a", Hash: hash}}},
				ForwardAuth: &store.ForwardAuth{Service: "auth"}},
			{Hosts: []string{"admin.example"}, Allow: []string{"10.0.0.0/8"}, RateLimit: &store.RateLimit{Requests: 10, Window: store.Duration(time.Minute)}},
		}},
	}}
	d := New(s, Options{})
	for _, call := range []func() error{
		func() error { _, err := d.Preview(ctx, protected); return err },
		func() error { _, err := d.Apply(ctx, protected); return err },
	} {
		se := store.AsError(call())
		if se == nil || se.Code != store.CodeVersionSkew ||
			!strings.Contains(se.Message, "gateways gw-old (0.41.0) cannot enforce a route's protection (release 0.42.0 or later can) and would serve these routes open") ||
			se.Detail["routes"] != "services.web.routes[1] (basic_auth,forward_auth),services.web.routes[2] (allow,rate_limit)" {
			t.Fatalf("with a 0.41.0 gateway live: %v (%+v)", se, se)
		}
	}
	if c, err := s.LiveCommit(ctx, "shop"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a refused apply committed %v (%v)", c, err)
	}
	if _, err := d.Preview(ctx, &store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"web"}, Routes: []store.Route{{Hosts: []string{"open.example"}, RedirectHTTPS: true}}}}}); err != nil {
		t.Fatalf("no protected route, old gateway: %v", err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-old", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Preview(ctx, protected); err != nil {
		t.Fatalf("every gateway current: %v", err)
	}
}
