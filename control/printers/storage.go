package printers

import (
	"fmt"
	"io"
	"strings"

	"github.com/edgeplane/edgeplane/control/storage"
)

// Storage writes the storage nodes, write quorum first.
func Storage(w io.Writer, v *storage.View) {
	if v.Quorum != nil {
		fmt.Fprintf(w, "QUORUM LOST: %s\n\n", v.Quorum.Message)
	} else {
		fmt.Fprintln(w, "write quorum: ok")
	}
	tw := table(w)
	fmt.Fprintln(tw, "NODE\tANSWERED\tMETA LEADER\tREPLICAS\tLEADS\tLAGGING")
	for _, n := range v.Nodes {
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%d\t%d\n", n.Name, yesNo(n.Answered), yesNo(n.MetaLeader), n.Replicas, n.Leads, n.Lagging)
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Import writes what a single box's import into a cluster carried over.
func Import(w io.Writer, rep *storage.ImportReport) {
	if len(rep.Signers) > 0 {
		fmt.Fprintf(w, "signers of the box certified under the cluster's trust root, retired at the box's last sequences: %s\n", strings.Join(rep.Signers, ", "))
	}
	if len(rep.Already) > 0 {
		fmt.Fprintf(w, "already imported: %s\n", strings.Join(rep.Already, ", "))
	}
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "not carried over (live observations their writers rebuild, and leases): %s\n", strings.Join(rep.Skipped, ", "))
	}
	fmt.Fprintf(w, "imported %d streams and buckets from %s; point agents, gateways and meshd at the cluster now\n", len(rep.Imported), rep.From)
}
