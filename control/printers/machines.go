package printers

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// Machines writes the machines with their liveness (and, probed, whether
// each answered now).
func Machines(w io.Writer, list []machines.Listed, probed bool) {
	tw := table(w)
	head := "MACHINE\tREGION\tLABELS\tSTATE\tADDRESS\tLIVENESS\tINSTANCES\tFREE"
	if probed {
		head += "\tREACHABLE"
	}
	fmt.Fprintln(tw, head)
	now := time.Now()
	for _, m := range list {
		live := m.Liveness
		if !m.LastBeat.IsZero() {
			live += " (" + now.Sub(m.LastBeat).Round(time.Second).String() + " ago)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d", m.ID, Dash(m.Region), labelsText(m.Labels), m.State, m.Address, live, m.Instances, m.Free)
		if probed {
			reach := "yes (" + m.RTT + ")"
			if !m.Reachable {
				reach = "no: " + shortCause(m.Problem)
			}
			fmt.Fprintf(tw, "\t%s", reach)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// Moved writes a machine's move to another address and what it takes.
func Moved(w io.Writer, mv *machines.Moved) {
	if mv.From == mv.Address {
		fmt.Fprintf(w, "machine %s stays at %s\n", mv.ID, mv.Address)
	} else {
		fmt.Fprintf(w, "machine %s moved from %s to %s\n", mv.ID, mv.From, mv.Address)
	}
	if len(mv.Republished) > 0 {
		fmt.Fprintf(w, "  routing published again for %s\n", strings.Join(mv.Republished, ", "))
	}
	fmt.Fprintf(w, "  instances listen where they were started: restart the machine's agent, then apply its namespaces again\n")
}

// Removed writes what retiring a machine took away.
func Removed(w io.Writer, rm *machines.Removed) {
	fmt.Fprintf(w, "machine %s removed", rm.Machine)
	if !rm.Reachable {
		fmt.Fprint(w, " (it did not answer)")
	}
	fmt.Fprintln(w)
	if len(rm.Instances) > 0 {
		fmt.Fprintf(w, "  forgot %d instances: %s\n", len(rm.Instances), strings.Join(rm.Instances, ", "))
		fmt.Fprintf(w, "  routing published again for %s; the next apply of each namespace places replacements\n", strings.Join(rm.Republished, ", "))
	}
	if rm.MeshIP != "" {
		fmt.Fprintf(w, "  left the mesh, releasing %s\n", rm.MeshIP)
	}
	if rm.Invites > 0 {
		fmt.Fprintln(w, "  its invite is void")
	}
	fmt.Fprintf(w, "  revoked %d recorded credentials (control creds ls --machine %s); credentials issued without a record still work until revoked: control creds revoke --user-creds FILE\n",
		rm.Credentials, rm.Machine)
}

// shortCause is the kind of failure a probe's problem names, for a cell.
func shortCause(p string) string {
	for _, c := range []string{store.CauseNoResponders, store.CauseTimeout, store.CauseTransport} {
		if strings.Contains(p, c) {
			return c
		}
	}
	return p
}

func labelsText(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
