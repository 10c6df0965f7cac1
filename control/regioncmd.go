package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/regions"
	"github.com/edgeplane/edgeplane/store"
)

func setupRegionList(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := regions.ReadList(c.ctx, s)
			if err != nil {
				return err
			}
			return c.out.emit(list, list.WriteText)
		})
	}
}

// setupRegionState is drain, disable and enable: each sets the region's
// state (regions.Set).
func setupRegionState(state string) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		wait := fs.Duration("wait", 0, "then wait, at most this long, until every live gateway applied the change (0: return once it is stored)")
		return func(c *call) error {
			return c.withStore(func(s *store.Store) error {
				ch, err := regions.Set(c.ctx, s, c.args[0], state, *wait)
				if err != nil {
					return err
				}
				return c.out.emit(ch, ch.WriteText)
			})
		}
	}
}
