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

// LiveGateway is a live gateway (its observation younger than
// store.GatewayObservationTTL) and the schema generation it runs.
type LiveGateway struct {
	// Name is "name (release)", as refusals name it.
	Name       string
	Generation int
}

// LiveGateways lists the live gateways with their generations, sorted by
// name: one read for a write that checks several generations.
func LiveGateways(ctx context.Context, s *store.Store) ([]LiveGateway, error) {
	var live []LiveGateway
	err := s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		if time.Since(g.At) < store.GatewayObservationTTL {
			live = append(live, LiveGateway{
				Name:       fmt.Sprintf("%s (%s)", g.Gateway, cmp.Or(g.Release, "release unknown")),
				Generation: store.GenerationOf(g.Generation, g.Release),
			})
		}
		return nil
	})
	slices.SortFunc(live, func(a, b LiveGateway) int { return strings.Compare(a.Name, b.Name) })
	return live, err
}

// Below names those of live that run a generation before gen: those that
// would not serve what gen brought.
func Below(live []LiveGateway, gen int) []string {
	var old []string
	for _, g := range live {
		if g.Generation < gen {
			old = append(old, g.Name)
		}
	}
	return old
}

// GatewaysBelow names the live gateways that run a schema generation
// before gen, as "name (release)", sorted: for a write that needs gen to
// refuse with version_skew.
func GatewaysBelow(ctx context.Context, s *store.Store, gen int) ([]string, error) {
	live, err := LiveGateways(ctx, s)
	return Below(live, gen), err
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
