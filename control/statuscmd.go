package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
)

func setupStatus(*flag.FlagSet) func(*call) error {
	return storeAnswer(func(c *call, s *store.Store) (*status.Fleet, error) { return status.ReadFleet(c.ctx, s) })
}
