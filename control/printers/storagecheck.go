package printers

import (
	"fmt"
	"io"
	"strings"

	"github.com/edgeplane/edgeplane/control/storage"
)

// StorageCheck writes every stream's copy on every storage node with its
// verdict, the leader's copy marked with *.
func StorageCheck(w io.Writer, r *storage.CheckReport) {
	tw := table(w)
	fmt.Fprintln(tw, "STREAM\tNODE\tVERDICT\tDETAIL")
	for _, c := range r.Copies {
		node := c.Node
		if c.Leader {
			node += "*"
		}
		verdict := string(c.Verdict)
		if c.Verdict == storage.VerdictLost {
			verdict = fmt.Sprintf("lost %d", c.Lost)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Stream, node, verdict, c.Detail)
	}
	tw.Flush()
	if len(r.Unanswered) > 0 {
		fmt.Fprintf(w, "not checked: storage nodes %s did not answer\n", strings.Join(r.Unanswered, ", "))
	}
}
