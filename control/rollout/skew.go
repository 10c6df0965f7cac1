package rollout

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// The skew policy a fleet upgrade keeps to, checked before any machine is
// told anything:
//
//   - never ahead of the control plane: agents, gateways and meshd run
//     the control plane's release or an older one, so a release newer
//     than the lowest one a control server announces is refused (upgrade
//     the control servers first). A control server that announces no
//     release (before v0.39.0) or runs a build without one ("dev") leaves
//     this check out: there is nothing to compare;
//   - one minor release at a time: each release may rely on its previous
//     minor having run (a store migrated, a record written both ways), so
//     a machine is never moved past the next minor release (0.38.x to
//     0.40.0 is refused, 0.38.x to 0.39.y is not); patch releases are
//     free, and a new major release is a step from any minor of the one
//     before. A machine on a build without a release ("dev") is left out.
//
// No flag overrides either: a fleet that must skip goes through each
// minor release in turn, which is what the policy tests.

// checkSkew refuses target for the machines at releases (by machine), with
// a structured version_skew error naming every machine in the way.
func checkSkew(ctx context.Context, s *store.Store, target string, releases map[string]string) error {
	to, err := version.Parse(target)
	if err != nil {
		return store.Errorf(store.CodeInvalid, "%v", err)
	}
	if plane, err := controlPlaneRelease(ctx, s); err != nil {
		return err
	} else if plane != "" && version.Older(plane, target) {
		return store.Errorf(store.CodeVersionSkew, "release %s is ahead of the control plane (its lowest control server runs %s): upgrade the control servers first", target, plane).
			With("release", target).With("control_plane", plane)
	}
	var skips []string
	for _, m := range slices.Sorted(maps.Keys(releases)) {
		from, err := version.Parse(releases[m])
		if err != nil {
			continue // "dev" or unknown: nothing to compare
		}
		if skipsAStep(from, to) {
			skips = append(skips, fmt.Sprintf("%s (%s)", m, releases[m]))
		}
	}
	if len(skips) > 0 {
		return store.Errorf(store.CodeVersionSkew, "release %s skips a minor release for %s: upgrade one minor release at a time", target, strings.Join(skips, ", ")).
			With("release", target).With("machines", strings.Join(skips, ", "))
	}
	return nil
}

// skipsAStep reports whether going from from to to skips a minor release.
func skipsAStep(from, to version.Parsed) bool {
	switch {
	case to.Major == from.Major:
		return to.Minor > from.Minor+1
	case to.Major == from.Major+1:
		return to.Minor > 0
	case to.Major > from.Major+1:
		return true
	}
	return false // a downgrade: refused (or allowed) elsewhere
}

// controlPlaneRelease is the lowest release a running control server
// announces, "" when none announces one that parses (a "dev" build among
// them makes it "" too: the check is left out with it).
func controlPlaneRelease(ctx context.Context, s *store.Store) (string, error) {
	low, dev := "", false
	now := time.Now()
	err := s.ListServerRecords(ctx, func(r *store.ServerRecord) error {
		if !r.Fresh(now) {
			return nil
		}
		if _, err := version.Parse(r.Release); err != nil {
			dev = true
			return nil
		}
		if low == "" || version.Older(r.Release, low) {
			low = r.Release
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reading the control servers' releases: %w", err)
	}
	if dev {
		return "", nil
	}
	return low, nil
}
