package status

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
)

// readProcesses reads every process heard from and the store's floor.
func readProcesses(ctx context.Context, s *store.Store) ([]fleet.Process, *store.StoreFloor, error) {
	ps, err := fleet.Processes(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	f, _, err := s.Floor(ctx)
	if err != nil {
		return nil, nil, err
	}
	return ps, f, nil
}

// generationText is a process's generation as shown: one it did not
// announce is the oldest it may be, marked so.
func generationText(p fleet.Process) string {
	if !p.Announced {
		return fmt.Sprintf("%d?", p.Generation)
	}
	return fmt.Sprint(p.Generation)
}

// writeProcesses writes, per kind, how many processes run each release at
// each generation, then the floor.
func writeProcesses(w io.Writer, ps []fleet.Process, f *store.StoreFloor) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tRELEASE\tGENERATION\tRUNNING")
	type group struct{ kind, release, gen string }
	by := map[group][]string{}
	for _, p := range ps {
		g := group{p.Kind, p.Release, generationText(p)}
		by[g] = append(by[g], p.Name)
	}
	groups := slices.SortedFunc(maps.Keys(by), func(a, b group) int {
		return cmp.Or(strings.Compare(a.kind, b.kind), strings.Compare(a.release, b.release), strings.Compare(a.gen, b.gen))
	})
	for _, g := range groups {
		names := by[g]
		shown := names
		if len(shown) > maxShown {
			shown = append(shown[:maxShown:maxShown], fmt.Sprintf("and %d more", len(names)-maxShown))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d: %s\n", g.kind, g.release, g.gen, len(names), strings.Join(shown, ", "))
	}
	tw.Flush()
	fmt.Fprintln(w, floorLine(f))
}

// floorLine says what the store's floor refuses, in one line.
func floorLine(f *store.StoreFloor) string {
	if f == nil || f.MinGeneration == 0 {
		return "store floor: none (no process is refused for its generation)"
	}
	return fmt.Sprintf("store floor: schema generation %d (edgeplane >= %s), raised by %s at %s",
		f.MinGeneration, cmp.Or(f.MinRelease, "?"), f.SetBy, f.At.Format("2006-01-02 15:04:05Z"))
}

// processesLine sums ps up in one line: per kind, the releases it runs
// and their generations ("?" where not announced).
func processesLine(ps []fleet.Process) string {
	type kr struct{ kind, what string }
	count := map[kr]int{}
	var kinds []string
	for _, p := range ps {
		if !slices.Contains(kinds, p.Kind) {
			kinds = append(kinds, p.Kind)
		}
		count[kr{p.Kind, p.Release + " gen " + generationText(p)}]++
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		var rel []string
		for _, key := range slices.SortedFunc(maps.Keys(count), func(a, b kr) int { return strings.Compare(a.what, b.what) }) {
			if key.kind == k {
				rel = append(rel, fmt.Sprintf("%d on %s", count[key], key.what))
			}
		}
		parts = append(parts, k+": "+strings.Join(rel, ", "))
	}
	if len(parts) == 0 {
		return "releases: no process heard from"
	}
	return "releases: " + strings.Join(parts, "; ")
}
