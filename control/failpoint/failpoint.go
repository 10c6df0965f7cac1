//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strings"
)

// Hit acts if name is listed in $EDGEPLANE_FAILPOINTS (comma separated).
// By default it exits at once, as a crash would: no deferred cleanup runs.
// With $EDGEPLANE_FAILPOINT_ACTION=pause, or an entry "name:pause", it
// prints PausedMarker and name and blocks forever, with every other
// goroutine (lease renewal, RPC) still running, so a test can kill -9 the
// process from outside at that step, or watch it hang there.
func Hit(name string) {
	for _, fp := range strings.Split(os.Getenv("EDGEPLANE_FAILPOINTS"), ",") {
		fp, action, _ := strings.Cut(strings.TrimSpace(fp), ":")
		if fp != name {
			continue
		}
		if action == "" {
			action = os.Getenv("EDGEPLANE_FAILPOINT_ACTION")
		}
		if action == "pause" {
			fmt.Fprintf(os.Stderr, "%s%s\n", PausedMarker, name)
			select {}
		}
		fmt.Fprintf(os.Stderr, "failpoint %s: exiting\n", name)
		os.Exit(ExitCode)
	}
}

// Enabled reports whether this build carries failpoints.
const Enabled = true
