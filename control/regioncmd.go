package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/regions"
	"github.com/edgeplane/edgeplane/store"
)

func setupRegionList(*flag.FlagSet) func(*call) error {
	return storeAnswer(func(c *call, s *store.Store) (regions.List, error) { return regions.ReadList(c.ctx, s) })
}

// setupRegionState is drain, disable and enable: each sets the region's
// state (regions.Set).
func setupRegionState(state string) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		wait := fs.Duration("wait", 0, "then wait, at most this long, until every live gateway applied the change (0: return once it is stored)")
		return storeAnswer(func(c *call, s *store.Store) (*regions.Change, error) {
			return regions.Set(c.ctx, s, c.args[0], state, *wait)
		})
	}
}
