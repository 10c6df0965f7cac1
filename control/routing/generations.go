package routing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// GatewaysBelow names the live gateways (their observation younger than
// store.GatewayObservationTTL) that run a schema generation before gen,
// as "name (release)", sorted: those that would not serve what gen
// brought, for a write that needs it to refuse with version_skew.
func GatewaysBelow(ctx context.Context, s *store.Store, gen int) ([]string, error) {
	var old []string
	err := s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		if time.Since(g.At) < store.GatewayObservationTTL && store.GenerationOf(g.Generation, g.Release) < gen {
			old = append(old, fmt.Sprintf("%s (%s)", g.Gateway, cmp.Or(g.Release, "release unknown")))
		}
		return nil
	})
	slices.Sort(old)
	return old, err
}

// RefuseGatewaysBelow is the version_skew refusal of a routing write that
// gateways before generation gen cannot read ("cannot <what> (release X
// or later can)"), naming them; nil when none is live.
func RefuseGatewaysBelow(ctx context.Context, s *store.Store, gen int, what string) error {
	old, err := GatewaysBelow(ctx, s, gen)
	if err != nil || len(old) == 0 {
		return err
	}
	return store.Errorf(store.CodeVersionSkew, "gateways %s cannot %s (release %s or later can): upgrade them first (control fleet upgrade)",
		strings.Join(old, ", "), what, store.FirstReleaseOf(gen)).With("gateways", strings.Join(old, ","))
}
