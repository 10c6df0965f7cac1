package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/rollout"
	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
)

func setupFleetUpgrade(fs *flag.FlagSet) func(*call) error {
	var o rollout.Options
	fs.IntVar(&o.Canary, "canary", 1, "machines upgraded first, one at a time, before any batch")
	fs.IntVar(&o.Batch, "batch", 0, "machines per batch after the canaries (default: a tenth of them, at least 1)")
	fs.IntVar(&o.MaxUnavailable, "max-unavailable", 1, "machines mid-upgrade at once, at most")
	fs.DurationVar(&o.HealthBound, "health-bound", 60*time.Second, "how long each machine's new release has to heartbeat, answer its RPCs and have its instances ready, before it rolls itself back")
	fs.DurationVar(&o.RPCTimeout, "rpc-timeout", 2*time.Minute, "how long a machine has to fetch and verify the release")
	fs.BoolVar(&o.AllowDowngrade, "allow-downgrade", false, "let machines move to a release older than the one they run")
	machineList := fs.String("machines", "", "only these machines, comma-separated (default: every machine)")
	return func(c *call) error {
		o.Release = c.args[0]
		o.Machines = splitList(*machineList)
		jsonOut := c.out.json
		o.Progress = func(st rollout.Step) {
			if jsonOut {
				return
			}
			line := fmt.Sprintf("%-10s %-12s %s", st.State, st.Machine, st.Phase)
			if st.Took > 0 {
				line += " (" + st.Took.String() + ")"
			}
			if st.Detail != "" {
				line += ": " + st.Detail
			}
			fmt.Fprintln(c.stdout, strings.TrimRight(line, " "))
		}
		return c.withStore(func(s *store.Store) error {
			res, err := rollout.Run(c.ctx, s, o)
			if res != nil {
				if perr := c.out.emit(res, func(w io.Writer) {
					fmt.Fprintf(w, "rollout %s: %d upgraded, %d already on %s, %d skipped, %d untouched, in %s\n",
						res.Rollout, len(res.Upgraded), len(res.Current), res.Release, len(res.Skipped), len(res.Untouched), res.Took)
				}); perr != nil {
					return perr
				}
			}
			return err
		})
	}
}

func setupFleetVersions(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			v, err := status.ReadVersions(c.ctx, s)
			if err != nil {
				return err
			}
			return c.out.emit(v.Releases, v.WriteText)
		})
	}
}
