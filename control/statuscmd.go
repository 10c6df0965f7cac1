package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
)

func setupStatus(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			v, err := status.ReadFleet(c.ctx, s)
			if err != nil {
				return err
			}
			return c.out.emit(v, v.WriteText)
		})
	}
}
