// Package version is the version edgeplane's binaries report, set at build
// time, and the order between two versions that a fleet upgrade keeps to
// (an agent refuses to go back unless told to).
package version

import (
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// Version is this build's version: "dev" unless the build sets it with
// -ldflags "-X github.com/edgeplane/edgeplane/internal/version.Version=1.4.0"
// (make build VERSION=1.4.0 and make package do).
var Version = "dev"

// Arch is the architecture a release's binaries are chosen by: GOOS/GOARCH
// of this build, e.g. linux/amd64.
func Arch() string { return runtime.GOOS + "/" + runtime.GOARCH }

// String is the version line a binary prints for its version command.
func String(binary string) string {
	return fmt.Sprintf("%s %s (%s, %s)", binary, Version, Arch(), runtime.Version())
}

// Parsed is a version as MAJOR.MINOR.PATCH with an optional -PRERELEASE.
// A leading "v" is allowed.
type Parsed struct {
	Major, Minor, Patch int
	Pre                 string
}

// preRe is what a prerelease may hold: it becomes part of NATS subjects
// and file names.
var preRe = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z-]*$`)

// Parse reads a release version. "dev" and anything that is not
// MAJOR.MINOR.PATCH[-PRE] are refused: a release must say where it stands.
func Parse(v string) (Parsed, error) {
	s := strings.TrimPrefix(v, "v")
	core, pre, _ := strings.Cut(s, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return Parsed{}, fmt.Errorf("version %q: want MAJOR.MINOR.PATCH[-PRERELEASE]", v)
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 || (len(p) > 1 && p[0] == '0') {
			return Parsed{}, fmt.Errorf("version %q: %q is not a number", v, p)
		}
		n[i] = x
	}
	if (pre == "" && strings.HasSuffix(s, "-")) || (pre != "" && !preRe.MatchString(pre)) {
		return Parsed{}, fmt.Errorf("version %q: bad prerelease %q", v, pre)
	}
	return Parsed{Major: n[0], Minor: n[1], Patch: n[2], Pre: pre}, nil
}

// Compare orders a and b: -1, 0 or 1. A prerelease comes before its
// release (1.2.0-rc1 < 1.2.0); prereleases order as strings.
func Compare(a, b Parsed) int {
	for _, d := range [...]int{a.Major - b.Major, a.Minor - b.Minor, a.Patch - b.Patch} {
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
	}
	switch {
	case a.Pre == b.Pre:
		return 0
	case a.Pre == "":
		return 1
	case b.Pre == "":
		return -1
	}
	return strings.Compare(a.Pre, b.Pre)
}

// Older reports whether version a comes before b. A version that does not
// parse ("dev") is older than any release, so a dev build can always be
// moved onto a release and never onto another dev build silently.
func Older(a, b string) bool {
	pa, errA := Parse(a)
	pb, errB := Parse(b)
	switch {
	case errA != nil && errB != nil:
		return false
	case errA != nil:
		return true
	case errB != nil:
		return false
	}
	return Compare(pa, pb) < 0
}
