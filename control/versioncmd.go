package main

import (
	"flag"
	"fmt"

	"github.com/edgeplane/edgeplane/internal/version"
)

func setupVersion(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		fmt.Fprintln(c.stdout, version.String("control"))
		return nil
	}
}
