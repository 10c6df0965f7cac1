package main

import (
	"flag"

	"github.com/edgeplane/edgeplane/control/join"
)

func setupJoin(fs *flag.FlagSet) func(*call) error {
	var o join.Options
	noStart := o.AddFlags(fs)
	return func(c *call) error {
		o.Token = c.args[0]
		return join.Command(c.ctx, c.stdout, o, *noStart)
	}
}

func setupLeave(fs *flag.FlagSet) func(*call) error {
	var o join.LeaveOptions
	noStop := o.AddFlags(fs)
	return func(c *call) error { return join.LeaveCommand(c.ctx, c.stdout, o, *noStop) }
}
