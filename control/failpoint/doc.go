// Package failpoint lets a test build crash a real process at a named step.
// Only binaries built with -tags failpoints carry it; in every other build
// Hit compiles to nothing.
package failpoint

// ExitCode is the status a process exits with at a failpoint.
const ExitCode = 97

// PausedMarker starts the line a process prints to stderr when it stops at a
// failpoint in pause mode; the failpoint's name follows it.
const PausedMarker = "failpoint paused: "
