package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// gatewaysServeErrorPages refuses, with version_skew, a manifest whose
// routes have error_pages while a live gateway runs a generation before
// edge protection: it would answer the route's errors with their own
// bodies and no report would say so. Rollbacks too.
func gatewaysServeErrorPages(live []routing.LiveGateway, m *store.Manifest) error {
	var paths []string
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		for i, r := range m.Services[name].Routes {
			if len(r.ErrorPages) > 0 {
				paths = append(paths, fmt.Sprintf("services.%s.routes[%d].error_pages", name, i))
			}
		}
	}
	if len(paths) == 0 {
		return nil
	}
	old := routing.Below(live, store.GenerationEdge)
	if len(old) == 0 {
		return nil
	}
	return store.Errorf(store.CodeVersionSkew, "gateways %s cannot serve error pages (release %s or later can), and this manifest has %s: upgrade them first (control fleet upgrade)",
		strings.Join(old, ", "), store.FirstReleaseOf(store.GenerationEdge), strings.Join(paths, ", ")).
		With("gateways", strings.Join(old, ",")).With("fields", strings.Join(paths, ","))
}
