package status

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/store"
)

// Release is one release and the machines that run it.
type Release struct {
	Release  string            `json:"release"`
	Machines []machines.Listed `json:"machines"`
}

// Versions is `control fleet versions`: the machines by the release their
// agent runs, the release most run first, every process by the release
// and schema generation it announces, the store's floor, and the latest
// rollout (-o json prints it all).
type Versions struct {
	Releases []Release
	Latest   *store.RolloutRecord
	// Processes are every process heard from, by kind, with the release
	// and schema generation each announces; Floor is the store's.
	Processes []fleet.Process
	Floor     *store.StoreFloor
}

// ReadVersions groups the machines by release ("unknown" for a machine
// that has not said) and reads the latest rollout.
func ReadVersions(ctx context.Context, s *store.Store) (*Versions, error) {
	list, err := machines.List(ctx, s, false, 0)
	if err != nil {
		return nil, err
	}
	by := map[string]*Release{}
	for _, m := range list {
		r := m.Release
		if r == "" {
			r = "unknown"
		}
		g := by[r]
		if g == nil {
			g = &Release{Release: r}
			by[r] = g
		}
		g.Machines = append(g.Machines, m)
	}
	v := &Versions{Releases: make([]Release, 0, len(by))}
	for _, g := range by {
		v.Releases = append(v.Releases, *g)
	}
	if v.Latest, err = s.LatestRollout(ctx); err != nil {
		return nil, err
	}
	if v.Processes, v.Floor, err = readProcesses(ctx, s); err != nil {
		return nil, err
	}
	groups := v.Releases
	sort.Slice(groups, func(i, j int) bool {
		return len(groups[i].Machines) > len(groups[j].Machines) || (len(groups[i].Machines) == len(groups[j].Machines) && groups[i].Release < groups[j].Release)
	})
	return v, nil
}

// WriteText writes the releases as a table, each machine that is not
// fresh or whose latest upgrade did not end confirmed noted, then the
// latest rollout.
func (v *Versions) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASE\tMACHINES\tLATEST UPGRADE")
	for _, g := range v.Releases {
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
		fmt.Fprintf(tw, "%s\t%d: %s\t%s\n", g.Release, len(g.Machines), strings.Join(ids, ", "), printers.Dash(strings.Join(notes, "; ")))
	}
	tw.Flush()
	writeProcesses(w, v.Processes, v.Floor)
	if v.Latest != nil {
		fmt.Fprintf(w, "\nlatest rollout: %s\n", rolloutLine(v.Latest))
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
