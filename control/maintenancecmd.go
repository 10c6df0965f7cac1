package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/store"
)

// setupMaintenance is ls, on and off: maintenance.Command reads their
// flags and arguments and does what they ask.
func setupMaintenance(verb string) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		run := maintenance.Command(fs, verb)
		return storeAnswer(func(c *call, s *store.Store) (maintenance.Answer, error) { return run(c.ctx, s, c.args) })
	}
}
