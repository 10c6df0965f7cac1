package regions

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Row is one region as `control region ls` shows it.
type Row struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// By and UpdatedAt are who set the state and when (empty for a region
	// no record names: active since its first machine joined).
	By        string    `json:"by,omitempty"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// Machines counts the region's machines by their own state (active,
	// draining, disabled); Instances what their agents last said they run.
	Machines  map[string]int `json:"machines"`
	Instances int            `json:"instances"`
	// Gateways are the gateways whose report names the region.
	Gateways []string `json:"gateways"`
}

// List is every known region, by name.
type List []Row

// ReadList reads every known region with its machines, instances and
// gateways; reads only.
func ReadList(ctx context.Context, s *store.Store) (List, error) {
	machines, records, err := Read(ctx, s)
	if err != nil {
		return nil, err
	}
	states, _, err := s.MachineObservations(ctx)
	if err != nil {
		return nil, err
	}
	rows := map[string]*Row{}
	for _, name := range Known(machines, records) {
		rec := records[name]
		rows[name] = &Row{Name: name, State: StateOf(records, name), By: rec.By, UpdatedAt: rec.UpdatedAt,
			Machines: map[string]int{}, Gateways: []string{}}
	}
	for id, m := range machines {
		if r := rows[m.Region]; r != nil {
			r.Machines[m.State]++
			r.Instances += states[id].Instances
		}
	}
	err = s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		if r := rows[g.Region]; r != nil {
			r.Gateways = append(r.Gateways, g.Gateway)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := List{}
	for _, name := range slices.Sorted(maps.Keys(rows)) {
		slices.Sort(rows[name].Gateways)
		out = append(out, *rows[name])
	}
	return out, nil
}

// WriteText writes l as a table.
func (l List) WriteText(w io.Writer) {
	if len(l) == 0 {
		fmt.Fprintln(w, "no regions: no machine has one (`control machine invite --region R`)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tSTATE\tSET BY\tMACHINES\tINSTANCES\tGATEWAYS")
	for _, r := range l {
		by := "-"
		if r.By != "" {
			by = r.By + " " + r.UpdatedAt.Local().Format(time.DateTime)
		}
		var ms []string
		for _, st := range []string{store.MachineActive, store.MachineDraining, store.MachineDisabled} {
			if n := r.Machines[st]; n > 0 {
				ms = append(ms, fmt.Sprintf("%d %s", n, st))
			}
		}
		machines, gateways := strings.Join(ms, ", "), strings.Join(r.Gateways, ",")
		if machines == "" {
			machines = "none"
		}
		if gateways == "" {
			gateways = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.Name, r.State, by, machines, r.Instances, gateways)
	}
	tw.Flush()
}

// WriteText says what the change did.
func (c *Change) WriteText(w io.Writer) {
	if !c.Changed {
		fmt.Fprintf(w, "region %s is already %s; nothing changed\n", c.Region.Name, c.Region.State)
		return
	}
	fmt.Fprintf(w, "region %s is %s (was %s): %s, routing sequence %d\n", c.Region.Name, c.Region.State, c.Previous, meaning(c.Region.State), c.Seq)
	if c.Gateways != "" {
		fmt.Fprintf(w, "%s gateways applied it\n", c.Gateways)
	}
	for _, g := range c.Laggards {
		fmt.Fprintf(w, "warning: gateway %s has not applied routing sequence %d\n", g, c.Seq)
	}
}

// meaning says what a region state does, for the operator who set it.
func meaning(state string) string {
	switch state {
	case store.RegionDraining:
		return "its instances serve only when no other region can; nothing new is placed there"
	case store.RegionDisabled:
		return "out of routing and placement; the next deploy of a service moves its instances there elsewhere"
	}
	return "it serves and takes new instances"
}

func fraction(n, of int) string { return fmt.Sprintf("%d/%d", n, of) }
