//go:build failpoints

// Package failpoint lets a test build crash a real process at a named step.
// Only binaries built with -tags failpoints carry it; in every other build
// Hit compiles to nothing.
package failpoint

import (
	"fmt"
	"os"
	"strings"
)

// ExitCode is the status a process exits with at a failpoint.
const ExitCode = 97

// Hit exits the process at once if name is listed in $EDGEPLANE_FAILPOINTS
// (comma separated), as a crash would: no deferred cleanup runs.
func Hit(name string) {
	for _, fp := range strings.Split(os.Getenv("EDGEPLANE_FAILPOINTS"), ",") {
		if strings.TrimSpace(fp) == name {
			fmt.Fprintf(os.Stderr, "failpoint %s: exiting\n", name)
			os.Exit(ExitCode)
		}
	}
}

// Enabled reports whether this build carries failpoints.
const Enabled = true
