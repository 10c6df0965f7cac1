package dnsproj

import (
	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// View is what the zone is built from: one immutable routing snapshot.
// *projection.View satisfies it. Implementations must be pointers (the zone
// compares views by identity to know when to rebuild) and must not change
// after they are handed out.
type View interface {
	// Services returns every service with its routable endpoints only:
	// each at its machine's admitted address (the projection sets the
	// others aside, see store.CheckEndpoint), so the zone answers no
	// address the control plane did not admit.
	Services() []*projection.Service
	// Machines returns every admitted machine.
	Machines() []store.MachineRecord
	// LiveEndpoints returns a service's endpoints on machines not judged
	// down (heartbeats stopped), or all of them when every one is (fail
	// open).
	LiveEndpoints(svc *projection.Service) (eps []store.Endpoint, failOpen bool)
	// Local reports whether every endpoint of svc is in region home and
	// home is active: the common case, answered as if there were no
	// regions.
	Local(svc *projection.Service, home string) bool
	// Tiers groups svc's endpoints, by region, in the order a reader in
	// home serves them (see projection.View.Tiers); disabled regions are
	// in none.
	Tiers(svc *projection.Service, home string, nearest []string) []projection.Tier
	// Down reports whether machine is judged down (its heartbeats
	// stopped).
	Down(machine string) (projection.MachineDown, bool)
}

// Source hands out the view to answer from now.
type Source interface {
	// Current returns the current view, the routing stream sequence it
	// reflects and whether it is stale (loaded from a local snapshot and
	// not yet confirmed by the store). It returns the same view until the
	// projection changes. The zone calls it on every query, so it must be
	// cheap (an atomic load).
	Current() (v View, seq uint64, stale bool)
}

// ProjectionSource serves the views of a running projection: the gateway's
// in a Caddy process, or one built by the standalone binary.
func ProjectionSource(p *projection.Projection) Source { return projSource{p} }

type projSource struct{ p *projection.Projection }

func (s projSource) Current() (View, uint64, bool) {
	v := s.p.View()
	return v, v.Seq, v.Stale
}
