package printers

import (
	"fmt"
	"io"

	"github.com/edgeplane/edgeplane/control/storage"
)

// StorageUpgradeStep is one line of a storage upgrade's progress: the
// node's state, whether it led the meta group, how long it took and what
// it came to.
func StorageUpgradeStep(w io.Writer, st storage.NodeStep) {
	line := fmt.Sprintf("%-10s %s", st.State, st.Node)
	if st.MetaLeader {
		line += " (meta leader)"
	}
	if st.Took > 0 {
		line += " in " + st.Took.String()
	}
	if st.Detail != "" {
		line += ": " + st.Detail
	}
	fmt.Fprintln(w, line)
}

// StorageUpgradeProgress is the progress callback of a storage upgrade
// printing to w, or none for JSON output (the result says it all).
func StorageUpgradeProgress(w io.Writer, json bool) func(storage.NodeStep) {
	if json {
		return nil
	}
	return func(st storage.NodeStep) { StorageUpgradeStep(w, st) }
}

// StorageUpgrade is a storage upgrade's summary line.
func StorageUpgrade(w io.Writer, r *storage.UpgradeResult) {
	fmt.Fprintf(w, "storage upgrade to %s: %d upgraded, %d already on it, %d untouched, in %s\n",
		r.Release, len(r.Upgraded), len(r.Current), len(r.Untouched), r.Took)
}
