package status

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// Region is one region's line of the fleet at a glance: its state, what
// runs there and the traffic it serves.
type Region struct {
	// Name is "" for the machines and gateways that have no region (shown
	// only when some other has one).
	Name string `json:"name"`
	// State is the state an operator set (active when none was, "" for
	// no region); By says who set it (empty for none).
	State    string `json:"state"`
	By       string `json:"by,omitempty"`
	Machines int    `json:"machines"`
	Gateways int    `json:"gateways"`
	// Instances counts the instances on the region's machines, Ready the
	// ready ones (from the fleet summaries). Partial is set when a
	// summary lists only its machines with instances not ready (a
	// namespace on very many machines): ready instances of that namespace
	// are then not counted here.
	Instances int  `json:"instances"`
	Ready     int  `json:"ready"`
	Partial   bool `json:"partial,omitempty"`
	// Traffic is the fleet's traffic in the region, over every service.
	Traffic store.RegionTraffic `json:"traffic"`
	// CrossShare is the share of the requests arriving at the region's
	// gateways that crossed to another region.
	CrossShare float64 `json:"cross_share"`
}

// ReadRegions gathers every known region, those of machines (list), of
// gateways reporting (gws), of the traffic in the fleet summaries (sums)
// and those a state was set for, with what runs there. A fleet where
// nothing has a region has none. A region state that cannot be read (an
// event that does not verify) is said in unreadable, not fatal: the rest
// of the status still shows.
func ReadRegions(ctx context.Context, s *store.Store, list []machines.Listed, gws []fleet.Gateway, sums map[string]store.NamespaceStatus) (regions []Region, unreadable string) {
	byName := map[string]*Region{}
	region := func(name string) *Region {
		r := byName[name]
		if r == nil {
			r = &Region{Name: name, State: store.RegionActive}
			if name == "" {
				r.State = "" // no region: no state either
			}
			byName[name] = r
		}
		return r
	}
	recs, err := s.RegionRecords(ctx)
	if err != nil {
		unreadable = err.Error()
	}
	for name, rec := range recs {
		r := region(name)
		r.State, r.By = rec.State, rec.By
	}
	machineRegion := map[string]string{}
	for _, m := range list {
		machineRegion[m.ID] = m.Region
		region(m.Region).Machines++
	}
	for _, g := range gws {
		region(g.Region).Gateways++
	}
	partial := false
	for _, sum := range sums {
		partial = partial || sum.MachinesTrimmed
		for m, c := range sum.Machines {
			r := region(machineRegion[m])
			r.Instances += c.Total()
			r.Ready += c.Ready
		}
	}
	for name, t := range fleet.RegionTotals(sums) {
		r := region(name)
		r.Traffic, r.CrossShare = t, t.CrossShare()
	}
	if len(byName) == 1 && byName[""] != nil {
		return nil, unreadable // no region anywhere: nothing to show
	}
	for _, r := range byName {
		r.Partial = partial
		regions = append(regions, *r)
	}
	// The regionless last: they are what is left over.
	slices.SortFunc(regions, func(a, b Region) int {
		return cmp.Or(cmp.Compare(boolInt(a.Name == ""), boolInt(b.Name == "")), cmp.Compare(a.Name, b.Name))
	})
	return regions, unreadable
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// writeRegions writes the regions section, if the fleet has regions.
func writeRegions(w io.Writer, regions []Region, unreadable string) {
	if unreadable != "" {
		fmt.Fprintf(w, "region states unreadable: %s\n", unreadable)
	}
	if len(regions) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tSTATE\tMACHINES\tGATEWAYS\tINSTANCES\tSERVED REQ/S\tARRIVED REQ/S\tCROSSED")
	for _, r := range regions {
		name := r.Name
		if name == "" {
			name = "(none)"
		}
		state := printers.Dash(r.State)
		if r.By != "" {
			state += " (by " + r.By + ")"
		}
		partial := ""
		if r.Partial {
			partial = " (partial)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d ready%s\t%.1f\t%.1f\t%.1f%%\n", name, state, r.Machines, r.Gateways,
			r.Ready, r.Instances, partial, r.Traffic.ServedRate, r.Traffic.ArrivedRate, 100*r.CrossShare)
	}
	tw.Flush()
}
