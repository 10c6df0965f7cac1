package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/store"
)

func setupMaintenanceList(*flag.FlagSet) func(*call) error {
	return storeAnswer(func(c *call, s *store.Store) (maintenance.List, error) { return maintenance.ReadList(c.ctx, s) })
}

// setupMaintenance is on and off: maintenance.Flags reads the flags and
// maintenance.Set does what they ask.
func setupMaintenance(on bool) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		req := maintenance.Flags(fs, on)
		return storeAnswer(func(c *call, s *store.Store) (*maintenance.Change, error) {
			return maintenance.Set(c.ctx, s, req(c.args))
		})
	}
}
