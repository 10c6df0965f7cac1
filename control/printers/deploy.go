package printers

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/store"
)

// Plan writes what applying a manifest would start, keep and stop.
func Plan(w io.Writer, p *deploy.Plan) {
	start, keep, stop := p.Counts()
	live := p.LiveID
	if live == "" {
		live = "none"
	}
	fmt.Fprintf(w, "namespace %s: revision %d (live: %s): %d to start, %d to keep, %d to stop\n", p.Namespace, p.Revision, live, start, keep, stop)
	tw := table(w)
	fmt.Fprintln(tw, "ACTION\tSERVICE\tSLOT\tINSTANCE\tMACHINE\tREASON")
	for _, a := range p.Actions {
		inst := a.InstanceID
		if a.Action == deploy.ActionStart {
			inst = "(new)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", a.Action, a.Service, a.Slot, inst, Dash(a.Machine), a.Reason)
	}
	tw.Flush()
}

// Applied writes the one line that ends an apply, a rollback or a destroy.
func Applied(w io.Writer, st *store.DeployStatus) {
	fmt.Fprintf(w, "deploy %s of %s is %s: revision %d, gateways %s\n", st.DeployID, st.Namespace, st.State, st.Revision, Dash(st.Gateways))
}

// History writes a namespace's final commits.
func History(w io.Writer, hist []store.DeployCommit) {
	tw := table(w)
	fmt.Fprintln(tw, "DEPLOY\tREVISION\tCOMMITTED\tSERVICES\tSLOTS\tNOTE")
	for _, h := range hist {
		note := ""
		switch {
		case h.Destroy:
			note = "destroy"
		case h.RollbackOf != "":
			note = "rollback to " + h.RollbackOf
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", h.ID, h.Revision, h.CreatedAt.Format(time.RFC3339),
			strings.Join(slices.Sorted(maps.Keys(h.Manifest.Services)), ","), len(h.Slots), note)
	}
	tw.Flush()
}
