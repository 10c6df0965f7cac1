// Package status gathers what the operator's status commands show, each
// from several parts of the fleet, and writes it for a person: the fleet
// at a glance (`control status`: fleet summaries, live commits, machines'
// liveness, gateways' lag, layer-4 entry points and connections, the
// ports gateways could not open and their drains, regions (states and
// traffic), the releases and schema generations processes
// announce, the store's floor), a namespace's deploy status (`control deploy
// status`: the latest deploy, its phases, canary verdicts and the fleet's
// counts and traffic), the machines by release (`control fleet versions`)
// and the instance records (`control instances`).
//
// Each view is one value: -o json prints it as it is, and its WriteText
// method writes the text form from that value alone, so the two never say
// different things. The package reads and shows; it decides nothing others
// act on (liveness is judged in control/machines and control/fleet).
package status

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// Fleet is `control status`: the fleet at a glance.
type Fleet struct {
	Namespaces []Namespace     `json:"namespaces"`
	Machines   Machines        `json:"machines"`
	Gateways   []fleet.Gateway `json:"gateways"`
	RoutingSeq uint64          `json:"routing_seq"`
	// Regions are the fleet's regions (none when nothing has a region);
	// RegionsUnreadable says why the states set for them could not be
	// read, when they could not.
	Regions           []Region `json:"regions,omitempty"`
	RegionsUnreadable string   `json:"regions_unreadable,omitempty"`
	// Processes and Floor: what every process heard from runs (release
	// and schema generation) and the store's floor.
	Processes []fleet.Process   `json:"processes"`
	Floor     *store.StoreFloor `json:"floor"`
	At        time.Time         `json:"at"`
}

// Namespace is one namespace's line of the fleet at a glance.
type Namespace struct {
	Namespace string       `json:"namespace"`
	Revision  int64        `json:"revision"`
	Deploy    string       `json:"deploy"`
	Destroyed bool         `json:"destroyed,omitempty"`
	Counts    store.Counts `json:"counts"`
	Machines  int          `json:"machines"`
	// LastErrors are the latest errors, by machine.
	LastErrors map[string]string `json:"last_errors,omitempty"`
	// Traffic is each service's traffic as the gateways report it.
	Traffic map[string]store.ServiceTrafficStatus `json:"traffic,omitempty"`
	// Layer4 are the entry points below HTTP of the live commit's
	// services, by service (those exposing any).
	Layer4 map[string]L4Entries `json:"layer4,omitempty"`
}

// Machines counts the machines by liveness.
type Machines struct {
	Total    int            `json:"total"`
	Liveness map[string]int `json:"liveness"`
	// NotFresh lists machines whose heartbeat is stale, offline or never
	// seen, with the age of their last beat.
	NotFresh []string `json:"not_fresh,omitempty"`
}

// ReadFleet reads the fleet at a glance.
func ReadFleet(ctx context.Context, s *store.Store) (*Fleet, error) {
	v := &Fleet{At: time.Now().UTC(), Namespaces: []Namespace{}}
	sums, err := fleet.Read(ctx, s)
	if err != nil {
		return nil, err
	}
	nss, err := s.CommittedNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	for _, ns := range nss {
		nv := Namespace{Namespace: ns}
		if live, err := s.LiveCommit(ctx, ns); err == nil {
			nv.Revision, nv.Deploy, nv.Destroyed = live.Revision, live.ID, live.Destroy
			if !live.Destroy {
				nv.Layer4 = layer4Of(live)
			}
		}
		if sum, ok := sums[ns]; ok {
			nv.Counts, nv.Machines, nv.LastErrors, nv.Traffic = sum.Counts, len(sum.Machines), sum.LastErrors, sum.Traffic
		}
		v.Namespaces = append(v.Namespaces, nv)
	}
	list, err := machines.List(ctx, s, false, 0)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	v.Machines = Machines{Total: len(list), Liveness: map[string]int{}}
	for _, m := range list {
		v.Machines.Liveness[m.Liveness]++
		if m.Liveness != store.MachineFresh {
			what := m.ID + " (" + m.Liveness
			if !m.LastBeat.IsZero() {
				what += ", last beat " + now.Sub(m.LastBeat).Round(time.Second).String() + " ago"
			}
			v.Machines.NotFresh = append(v.Machines.NotFresh, what+")")
		}
	}
	if v.Processes, v.Floor, err = readProcesses(ctx, s); err != nil {
		return nil, err
	}
	if v.RoutingSeq, v.Gateways, err = fleet.Gateways(ctx, s); err != nil {
		return nil, err
	}
	v.Regions, v.RegionsUnreadable = ReadRegions(ctx, s, list, v.Gateways, sums)
	return v, nil
}

// maxShown bounds the machines a text view names one by one.
const maxShown = 10

// WriteText writes the fleet at a glance for a person.
func (v *Fleet) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tREVISION\tDEPLOY\tREADY\tSTARTING\tBACKOFF\tFAILED\tSTALE\tMACHINES")
	for _, n := range v.Namespaces {
		rev := fmt.Sprint(n.Revision)
		if n.Destroyed {
			rev += " (destroyed)"
		}
		c := n.Counts
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", n.Namespace, rev, printers.Dash(n.Deploy), c.Ready, c.Starting, c.Backoff, c.Failed, c.Stale, n.Machines)
	}
	tw.Flush()
	for _, n := range v.Namespaces {
		for _, m := range slices.Sorted(maps.Keys(n.LastErrors)) {
			fmt.Fprintf(w, "  %s on %s: %s\n", n.Namespace, m, n.LastErrors[m])
		}
	}
	writeTraffic(w, v.Namespaces)
	writeLayer4(w, v.Namespaces)
	writeRegions(w, v.Regions, v.RegionsUnreadable)
	l := v.Machines.Liveness
	fmt.Fprintf(w, "machines: %d (%d fresh, %d stale, %d offline, %d never seen)\n", v.Machines.Total,
		l[store.MachineFresh], l[store.MachineStale], l[store.MachineOffline], l[store.MachineNeverSeen])
	for i, nf := range v.Machines.NotFresh {
		if i == maxShown {
			fmt.Fprintf(w, "  and %d more\n", len(v.Machines.NotFresh)-maxShown)
			break
		}
		fmt.Fprintf(w, "  %s\n", nf)
	}
	fmt.Fprintf(w, "gateways: %d reporting, routing at sequence %d\n", len(v.Gateways), v.RoutingSeq)
	for _, g := range v.Gateways {
		state := "current"
		if g.Lag > 0 {
			state = fmt.Sprintf("%d behind", g.Lag)
		}
		if g.Stale {
			state += ", stale view"
		}
		in := ""
		if g.Region != "" {
			in = " in " + g.Region
		}
		fmt.Fprintf(w, "  %s%s at %d (%s)\n", g.Gateway, in, g.AppliedSeq, state)
		writeGatewayL4(w, g, v.At)
	}
	fmt.Fprintln(w, processesLine(v.Processes))
	fmt.Fprintln(w, floorLine(v.Floor))
}

// writeTraffic writes every service's fleet traffic, if any gateway
// reported some.
func writeTraffic(w io.Writer, nss []Namespace) {
	// A service only reached below HTTP is in the layer-4 table alone.
	l4Only := func(t store.ServiceTrafficStatus) bool { return t.L4 != nil && t.Requests == 0 && t.Open == 0 }
	var any bool
	for _, n := range nss {
		for _, t := range n.Traffic {
			any = any || !l4Only(t)
		}
	}
	if !any {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tREQ/S\t5XX\tP50\tP99\tOPEN\tREQUESTS\tGATEWAYS")
	for _, n := range nss {
		for _, svc := range slices.Sorted(maps.Keys(n.Traffic)) {
			t := n.Traffic[svc]
			if l4Only(t) {
				continue
			}
			fmt.Fprintf(tw, "%s/%s\t%s\n", n.Namespace, svc, trafficColumns(t.TrafficFigures, len(t.Gateways)))
		}
	}
	tw.Flush()
}

// latency formats a latency in seconds, "-" for none.
func latency(s float64) string {
	if s == 0 {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}

// trafficColumns formats figures as the traffic table's columns after the
// name.
func trafficColumns(f store.TrafficFigures, gateways int) string {
	return fmt.Sprintf("%.1f\t%.2f%%\t%s\t%s\t%d\t%d\t%d", f.Rate, 100*f.ErrorRatio, latency(f.P50), latency(f.P99), f.Open, f.Requests, gateways)
}

// trafficLine formats figures on one line.
func trafficLine(f store.TrafficFigures) string {
	line := fmt.Sprintf("%.1f req/s, %.2f%% 5xx, p50 %s, p99 %s, %d open, %d requests", f.Rate, 100*f.ErrorRatio, latency(f.P50), latency(f.P99), f.Open, f.Requests)
	if f.L4 != nil {
		line += "; layer 4: " + l4Line(f.L4)
	}
	return line
}
