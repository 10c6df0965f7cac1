package projection

import "github.com/edgeplane/edgeplane/store"

// BuildView builds a view from events, for tests outside the package.
func BuildView(evs []store.RoutingEvent) (*View, error) {
	b := newBuilder(emptyView(false))
	for i := range evs {
		if err := b.apply(&evs[i]); err != nil {
			return nil, err
		}
	}
	return b.finish(uint64(len(evs)), false), nil
}

// Unverified makes p apply routing events without checking their
// signatures: the unsigned baseline of BenchmarkEventApply. Call it before
// Run.
func Unverified(p *Projection) { p.skipVerify = true }

// Rebuilt is v with its derived lists (digest, conflicts, host list)
// forgotten, as a view that changed has them.
func Rebuilt(v *View) *View {
	c := *v
	c.lists = new(lazyLists)
	return &c
}
