package printers

import (
	"fmt"
	"io"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// ReleaseBinaries writes a release's binaries with their size and digest.
func ReleaseBinaries(w io.Writer, r *store.ReleaseRecord) {
	tw := table(w)
	for _, name := range store.ReleaseBinaryNames {
		if b, ok := r.Binaries[name]; ok {
			fmt.Fprintf(tw, "  %s\t%d bytes\tsha256 %s\n", name, b.Size, b.SHA256)
		}
	}
	tw.Flush()
}

// Releases writes the pushed releases.
func Releases(w io.Writer, list []store.ReleaseRecord) {
	tw := table(w)
	fmt.Fprintln(tw, "RELEASE\tARCH\tBINARIES\tPUSHED\tNOTES")
	for _, r := range list {
		var names []string
		for _, n := range store.ReleaseBinaryNames {
			if _, ok := r.Binaries[n]; ok {
				names = append(names, n)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Release, r.Arch, strings.Join(names, ","), r.PushedAt.Format("2006-01-02 15:04:05Z"), Dash(r.Notes))
	}
	tw.Flush()
}
