//go:build !failpoints

package failpoint

// Hit does nothing in production builds.
func Hit(string) {}

// Enabled reports whether this build carries failpoints.
const Enabled = false
