package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/rollout"
	"github.com/edgeplane/edgeplane/internal/upgrade"
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

// versionGroup is one release and the machines that run it.
type versionGroup struct {
	Release  string            `json:"release"`
	Machines []machines.Listed `json:"machines"`
}

func setupFleetVersions(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := machines.List(c.ctx, s, false, 0)
			if err != nil {
				return err
			}
			by := map[string]*versionGroup{}
			for _, m := range list {
				r := m.Release
				if r == "" {
					r = "unknown"
				}
				g := by[r]
				if g == nil {
					g = &versionGroup{Release: r}
					by[r] = g
				}
				g.Machines = append(g.Machines, m)
			}
			groups := make([]versionGroup, 0, len(by))
			for _, g := range by {
				groups = append(groups, *g)
			}
			latest, err := s.LatestRollout(c.ctx)
			if err != nil {
				return err
			}
			sort.Slice(groups, func(i, j int) bool {
				return len(groups[i].Machines) > len(groups[j].Machines) || (len(groups[i].Machines) == len(groups[j].Machines) && groups[i].Release < groups[j].Release)
			})
			return c.out.emit(groups, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "RELEASE\tMACHINES\tLATEST UPGRADE")
				for _, g := range groups {
					ids := make([]string, len(g.Machines))
					var notes []string
					for i, m := range g.Machines {
						ids[i] = m.ID
						if m.Liveness != store.MachineFresh {
							ids[i] += " (" + m.Liveness + ")"
						}
						if u := m.Upgrade; u != nil && u.State != upgrade.StateConfirmed {
							note := fmt.Sprintf("%s: %s %s→%s", m.ID, u.State, u.From, u.To)
							if u.Reason != "" {
								note += ": " + u.Reason
							}
							notes = append(notes, note)
						}
					}
					fmt.Fprintf(tw, "%s\t%d: %s\t%s\n", g.Release, len(g.Machines), strings.Join(ids, ", "), dash(strings.Join(notes, "; ")))
				}
				tw.Flush()
				if latest != nil {
					fmt.Fprintf(w, "\nlatest rollout: %s\n", rolloutLine(latest))
				}
			})
		})
	}
}

// rolloutLine says where a rollout stands, in one line.
func rolloutLine(r *store.RolloutRecord) string {
	line := fmt.Sprintf("%s to %s, %s: %d upgraded, %d already on it, %d skipped, of %d", r.ID, r.Release, r.State, r.Upgraded, r.Current, r.Skipped, r.Total)
	if r.State == store.RolloutRunning && r.Phase != "" {
		line += " (" + r.Phase + ", updated " + time.Since(r.Updated).Round(time.Second).String() + " ago)"
	}
	if r.FailedMachine != "" {
		line += "; stopped at " + r.FailedMachine + ": " + r.Reason
	}
	return line
}
