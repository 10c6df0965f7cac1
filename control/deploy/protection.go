package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// gatewaysServeProtection refuses, with version_skew, a manifest with a
// protected route (store.Route.HasProtection: basic_auth, forward_auth,
// allow/deny, rate_limit) while a live gateway runs a generation before
// edge protection: it would read the route without those fields and serve
// it open. Rollbacks too: a route served open is as open on the way back.
func gatewaysServeProtection(live []routing.LiveGateway, m *store.Manifest) error {
	routes := protectedRoutes(m)
	if len(routes) == 0 {
		return nil
	}
	old := routing.Below(live, store.GenerationEdge)
	if len(old) == 0 {
		return nil
	}
	var named []string
	for _, path := range slices.Sorted(maps.Keys(routes)) {
		named = append(named, fmt.Sprintf("%s (%s)", path, routes[path]))
	}
	return store.Errorf(store.CodeVersionSkew, "gateways %s cannot enforce a route's protection (release %s or later can) and would serve these routes open: %s; upgrade them first (control fleet upgrade)",
		strings.Join(old, ", "), store.FirstReleaseOf(store.GenerationEdge), strings.Join(named, ", ")).
		With("gateways", strings.Join(old, ",")).With("routes", strings.Join(named, ","))
}

// protectedRoutes names m's protected routes by field path
// ("services.web.routes[0]": "basic_auth,allow"), each with the fields
// that protect it.
func protectedRoutes(m *store.Manifest) map[string]string {
	out := map[string]string{}
	for name, s := range m.Services {
		for i := range s.Routes {
			r := &s.Routes[i]
			if !r.HasProtection() {
				continue
			}
			var fields []string
			for _, f := range []struct {
				name string
				on   bool
			}{{"basic_auth", r.BasicAuth != nil}, {"forward_auth", r.ForwardAuth != nil}, {"allow", len(r.Allow) > 0},
				{"deny", len(r.Deny) > 0}, {"rate_limit", r.RateLimit != nil}} {
				if f.on {
					fields = append(fields, f.name)
				}
			}
			out[fmt.Sprintf("services.%s.routes[%d]", name, i)] = strings.Join(fields, ",")
		}
	}
	return out
}
