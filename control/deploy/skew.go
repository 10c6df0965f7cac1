package deploy

import (
	"context"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// gatewaysServe refuses, with version_skew, a manifest using what a live
// gateway's generation cannot serve (layer-4 entry points, protected
// routes, error pages; each refusal names the gateways and the fields).
// The gateways' observations are read once, and only for a manifest that
// uses any of it: most manifests cost no read.
func gatewaysServe(ctx context.Context, s *store.Store, m *store.Manifest) error {
	if !usesGenerationFeatures(m) {
		return nil
	}
	live, err := routing.LiveGateways(ctx, s)
	if err != nil {
		return err
	}
	for _, refuse := range []func([]routing.LiveGateway, *store.Manifest) error{
		gatewaysServeLayer4, gatewaysServeProtection, gatewaysServeErrorPages,
	} {
		if err := refuse(live, m); err != nil {
			return err
		}
	}
	return nil
}

// usesGenerationFeatures says whether m has anything gatewaysServe checks.
func usesGenerationFeatures(m *store.Manifest) bool {
	for _, spec := range m.Services {
		if !spec.Layer4.Empty() {
			return true
		}
		for i := range spec.Routes {
			if r := &spec.Routes[i]; r.HasProtection() || len(r.ErrorPages) > 0 {
				return true
			}
		}
	}
	return false
}
