//go:build !failpoints

// Package failpoint lets a test build crash a real process at a named step.
// Only binaries built with -tags failpoints carry it; in every other build
// Hit compiles to nothing.
package failpoint

// Hit does nothing in production builds.
func Hit(string) {}

// Enabled reports whether this build carries failpoints.
const Enabled = false
