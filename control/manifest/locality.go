package manifest

import (
	"fmt"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// MaxSlowStart bounds a service's slow start: a ramp longer than this
// keeps a new instance underused long after it is warm.
const MaxSlowStart = 10 * time.Minute

// validateLocality checks a service's locality and slow start (p is the
// service's path). Whether the regions it names exist is the apply's
// question (deploy checks them against the fleet); here only their
// spelling and the policy's sense are.
func validateLocality(p string, s store.ServiceSpec, add func(path, format string, args ...any)) {
	if d := time.Duration(s.SlowStart); d < 0 || d > MaxSlowStart {
		add(p+".slow_start", "must be between 0 (none) and %s", MaxSlowStart)
	}
	l := s.Locality
	if l == nil {
		return
	}
	if !store.ValidLocalityPolicy(l.Policy) {
		add(p+".locality.policy", "unknown policy %q: want %s, %s or %s", l.Policy, store.LocalityPrefer, store.LocalityStrict, store.LocalityAny)
		return
	}
	if len(l.Order) > 0 && l.PolicyOrDefault() != store.LocalityPrefer {
		add(p+".locality.order", "an order applies to %s only: %s never leaves the reader's region and %s serves every region alike",
			store.LocalityPrefer, store.LocalityStrict, store.LocalityAny)
		return
	}
	seen := map[string]int{}
	for i, r := range l.Order {
		rp := fmt.Sprintf("%s.locality.order[%d]", p, i)
		if !labelRe.MatchString(r) {
			add(rp, "region %q is not a DNS label", r)
			continue
		}
		if j, ok := seen[r]; ok {
			add(rp, "region %s is already at order[%d]", r, j)
			continue
		}
		seen[r] = i
	}
}

// Regions names every region m's services refer to (placement.regions and
// locality.order) by field path, for the apply to check each against the
// regions the fleet knows.
func Regions(m *store.Manifest) map[string]string {
	out := map[string]string{}
	for name, s := range m.Services {
		p := "services." + name
		for i, r := range s.Placement.Regions {
			out[fmt.Sprintf("%s.placement.regions[%d]", p, i)] = r
		}
		if s.Locality != nil {
			for i, r := range s.Locality.Order {
				out[fmt.Sprintf("%s.locality.order[%d]", p, i)] = r
			}
		}
	}
	return out
}
