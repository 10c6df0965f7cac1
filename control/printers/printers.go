// Package printers writes the answers of control's list and report
// commands as text for a person: a table (text/tabwriter, two spaces
// between columns) or a few lines per answer. -o json prints the same
// values as they are, so a printer only lays out what it is given: it
// reads nothing and decides nothing (what is stale, refused or incoherent
// was decided by the package that made the value). The status views that
// gather several parts before showing them are control/status.
package printers

import (
	"io"
	"text/tabwriter"
)

// table is the CLI's one table layout.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// Dash is s, or "-" for an empty cell or value.
func Dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
