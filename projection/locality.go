package projection

import (
	"slices"
	"sort"

	"github.com/edgeplane/edgeplane/store"
)

// Locality. Every endpoint is in its machine's region. A reader (a
// gateway, a DNS server) in region home groups a service's endpoints into
// tiers under the service's locality policy and the regions' states, and
// serves from the first tier that can serve; which endpoint of a tier can
// serve (machine liveness, health probes, canary sides) is the reader's
// business. The projection offers the grouping, the same on every reader
// of one view, so that a gateway and the DNS server beside it agree.

// RegionOf is the region of e's machine; "" when the machine has none or
// is not in the view.
func (v *View) RegionOf(e store.Endpoint) string {
	m, _ := v.machines.get(e.Machine)
	return m.Region
}

// RegionState is region's state: the state set for it, else active.
func (v *View) RegionState(region string) string {
	if r, ok := v.regions[region]; ok {
		return r.State
	}
	return store.RegionActive
}

// RegionRecord returns the state record of region, if one was set.
func (v *View) RegionRecord(region string) (store.RegionRecord, bool) {
	r, ok := v.regions[region]
	return r, ok
}

// RegionRecords lists the region state records, sorted by name.
func (v *View) RegionRecords() []store.RegionRecord {
	out := make([]store.RegionRecord, 0, len(v.regions))
	for _, r := range v.regions {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// KnownRegions lists every region a machine of the view is in or a state
// was set for, sorted; "" (machines without a region) is left out.
// The list is shared: callers must not change it.
func (v *View) KnownRegions() []string {
	v.lists.regionsOnce.Do(func() {
		out := make([]string, 0, len(v.machineRegions)+len(v.regions))
		for r := range v.machineRegions {
			out = append(out, r)
		}
		for r := range v.regions {
			if _, ok := v.machineRegions[r]; !ok {
				out = append(out, r)
			}
		}
		sort.Strings(out)
		v.lists.knownRegions = out
	})
	return v.lists.knownRegions
}

// Tier is a group of a service's endpoints a reader serves from together:
// indexes into Service.Endpoints, all in one region (Region), whose state
// is State. Under LocalityAny the active regions make one tier, Region "".
type Tier struct {
	Region    string
	State     string
	Endpoints []int
}

// Tiers groups svc's endpoints for a reader in region home, in the order
// the reader tries them:
//
//   - LocalityPrefer (the default): home's, then every other active
//     region's one by one (the service's Locality.Order first, then the
//     order of nearest, the regions the reader measured nearest first,
//     then by name), then the draining regions' in the same order;
//   - LocalityStrict: home's only, whatever its state but disabled;
//   - LocalityAny: every active region's as one tier, then every
//     draining region's as another.
//
// A disabled region's endpoints are in no tier. A reader without a region
// (home "") serves as under LocalityAny, except under LocalityStrict,
// where only endpoints without a region are home. Tiers without
// endpoints are left out.
func (v *View) Tiers(svc *Service, home string, nearest []string) []Tier {
	policy := svc.Locality.PolicyOrDefault()
	if home == "" && policy == store.LocalityPrefer {
		policy = store.LocalityAny
	}
	byRegion := map[string][]int{}
	var regions []string
	for i, e := range svc.Endpoints {
		r := v.RegionOf(e)
		if _, ok := byRegion[r]; !ok {
			regions = append(regions, r)
		}
		byRegion[r] = append(byRegion[r], i)
	}
	switch policy {
	case store.LocalityStrict:
		st := v.RegionState(home)
		if st == store.RegionDisabled || len(byRegion[home]) == 0 {
			return nil
		}
		return []Tier{{Region: home, State: st, Endpoints: byRegion[home]}}
	case store.LocalityAny:
		var active, draining Tier
		active.State, draining.State = store.RegionActive, store.RegionDraining
		// Endpoints keep their slot order within a tier.
		for i, e := range svc.Endpoints {
			switch v.RegionState(v.RegionOf(e)) {
			case store.RegionActive:
				active.Endpoints = append(active.Endpoints, i)
			case store.RegionDraining:
				draining.Endpoints = append(draining.Endpoints, i)
			}
		}
		var out []Tier
		for _, t := range []Tier{active, draining} {
			if len(t.Endpoints) > 0 {
				out = append(out, t)
			}
		}
		return out
	}
	rank := regionRank(home, svc.Locality, nearest)
	sort.SliceStable(regions, func(i, j int) bool {
		ri, rj := rank(regions[i]), rank(regions[j])
		if ri != rj {
			return ri < rj
		}
		return regions[i] < regions[j]
	})
	out := make([]Tier, 0, len(regions))
	for _, want := range []string{store.RegionActive, store.RegionDraining} {
		for _, r := range regions {
			if st := v.RegionState(r); st == want {
				out = append(out, Tier{Region: r, State: st, Endpoints: byRegion[r]})
			}
		}
	}
	return out
}

// regionRank orders regions for a reader in home: home first, then the
// service's order, then nearest, then every other region alike (callers
// break ties by name); regions without a name come last.
func regionRank(home string, l *store.Locality, nearest []string) func(string) int {
	var order []string
	if l != nil {
		order = l.Order
	}
	return func(r string) int {
		switch {
		case r == home:
			return 0
		case r == "":
			return 1 + len(order) + len(nearest) + 1
		}
		if i := slices.Index(order, r); i >= 0 {
			return 1 + i
		}
		if i := slices.Index(nearest, r); i >= 0 {
			return 1 + len(order) + i
		}
		return 1 + len(order) + len(nearest)
	}
}

// Local reports whether every endpoint of svc is in home and home is
// active: the common case, in which Tiers is one tier of every endpoint
// and a reader may skip it.
func (v *View) Local(svc *Service, home string) bool {
	if v.RegionState(home) != store.RegionActive {
		return false
	}
	for _, e := range svc.Endpoints {
		if v.RegionOf(e) != home {
			return false
		}
	}
	return true
}
