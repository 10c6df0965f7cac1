package status

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
)

// Layer 4 in the status: a service's entry points below HTTP come from
// the namespace's live commit (what the gateways are asked to open), its
// connections from the fleet's traffic summary; what each gateway could
// not open, and the connections it lets drain, from its observation.

// L4Entries are the entry points a service's live commit exposes below
// HTTP: "tcp/5432", "udp/5353", "tls/db.example.com" (passthrough), and
// how long a connection to an instance that left routing may drain.
type L4Entries struct {
	Entries      []string       `json:"entries"`
	DrainTimeout store.Duration `json:"drain_timeout"`
}

// layer4Of lists the services of a live commit that expose anything
// below HTTP; nil when none does.
func layer4Of(c *store.DeployCommit) map[string]L4Entries {
	var out map[string]L4Entries
	for name, spec := range c.Manifest.Services {
		if spec.Layer4.Empty() {
			continue
		}
		if out == nil {
			out = map[string]L4Entries{}
		}
		out[name] = L4Entries{Entries: EntryPoints(&spec.Layer4), DrainTimeout: store.Duration(spec.Layer4.Drain())}
	}
	return out
}

// EntryPoints names what l exposes: its ports ("tcp/5432"), TCP first,
// then its passthrough hosts ("tls/db.example.com").
func EntryPoints(l *store.Layer4) []string {
	var out []string
	for _, k := range l.Ports() {
		out = append(out, k.String())
	}
	for _, h := range l.PassthroughHosts() {
		out = append(out, "tls/"+h)
	}
	return out
}

// writeLayer4 writes every service with layer-4 entry points or
// connections, if any has some.
func writeLayer4(w io.Writer, nss []Namespace) {
	type row struct {
		name    string
		entries []string
		f       *store.L4Figures
	}
	var rows []row
	for _, n := range nss {
		names := map[string]bool{}
		for svc := range n.Layer4 {
			names[svc] = true
		}
		for svc, t := range n.Traffic {
			if t.L4 != nil {
				names[svc] = true
			}
		}
		for _, svc := range slices.Sorted(maps.Keys(names)) {
			rows = append(rows, row{name: n.Namespace + "/" + svc, entries: n.Layer4[svc].Entries, f: n.Traffic[svc].L4})
		}
	}
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER 4\tENTRY POINTS\tOPEN\tCONN/S\tIN B/S\tOUT B/S\tCONNECTIONS\tCONNECT ERRORS\tREFUSED")
	for _, r := range rows {
		entries := "-"
		if len(r.entries) > 0 {
			entries = strings.Join(r.entries, " ")
		}
		f := r.f
		if f == nil {
			f = &store.L4Figures{}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.0f\t%.0f\t%d\t%d\t%d\n", r.name, entries, f.Open, f.Rate, f.BytesInRate, f.BytesOutRate,
			f.Total, f.ConnectErrors, f.Refused)
	}
	tw.Flush()
}

// l4Line formats layer-4 figures on one line.
func l4Line(f *store.L4Figures) string {
	return fmt.Sprintf("%.1f conn/s, %d open, %d connections, %.0f B/s in, %.0f B/s out, %d connect errors, %d refused",
		f.Rate, f.Open, f.Total, f.BytesInRate, f.BytesOutRate, f.ConnectErrors, f.Refused)
}

// writeGatewayL4 writes, under a gateway's line, the conflicts it reports,
// the ports it could not open and the drains it has in progress, at most
// maxShown of each; at is the status's time.
func writeGatewayL4(w io.Writer, g fleet.Gateway, at time.Time) {
	more := func(i, n int) bool {
		if i == maxShown {
			fmt.Fprintf(w, "      and %d more\n", n-i)
			return true
		}
		return false
	}
	for i, c := range g.Conflicts {
		if more(i, len(g.Conflicts)) {
			break
		}
		fmt.Fprintf(w, "    conflict: %s\n", c)
	}
	for i, e := range g.L4Errors {
		if more(i, len(g.L4Errors)) {
			break
		}
		fmt.Fprintf(w, "    port %s of %s/%s not open%s: %s\n", e.Port, e.Namespace, e.Service, since(e.Since, at), e.Error)
	}
	for i, d := range g.L4Draining {
		if more(i, len(g.L4Draining)) {
			break
		}
		fmt.Fprintf(w, "    draining %d connections of %s/%s to %s %s\n", d.Conns, d.Namespace, d.Service, d.Instance, until(d.Until, at))
	}
}

// since says how long ago t was, "" for no time.
func since(t, at time.Time) string {
	if t.IsZero() {
		return ""
	}
	return " for " + at.Sub(t).Round(time.Second).String()
}

// until says when a drain's deadline is, or how long ago it passed.
func until(t, at time.Time) string {
	if d := t.Sub(at).Round(time.Second); d >= 0 {
		return "for up to " + d.String() + " more"
	}
	return "past its deadline by " + at.Sub(t).Round(time.Second).String()
}
