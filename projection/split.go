package projection

import "github.com/edgeplane/edgeplane/store"

// Canary splits. While a canary routes a service, its endpoints of
// Split.Revision (the new instances) take Split.Weight percent of the
// traffic and the others the rest. How one request picks a side is the
// gateway's business (cookies, headers); what the projection offers is
// the split of the endpoints and the DNS weights that follow from it.

// IsNew reports whether e is on the new side of s's split; false when s
// is not split.
func (s *Service) IsNew(e store.Endpoint) bool {
	return s.Split != nil && e.Revision == s.Split.Revision
}

type sidesMemo struct{}

// Sides returns the indexes into s.Endpoints of the old and of the new
// side of its split (every endpoint is old when s is not split),
// computed once per Service.
func (s *Service) Sides() (old, fresh []int) {
	v := s.Memo(sidesMemo{}, func(s *Service) any {
		var sides [2][]int
		for i, e := range s.Endpoints {
			if s.IsNew(e) {
				sides[1] = append(sides[1], i)
			} else {
				sides[0] = append(sides[0], i)
			}
		}
		return sides
	}).([2][]int)
	return v[0], v[1]
}

// unsplitSRVWeight is the SRV weight of every endpoint of a service that
// is not split.
const unsplitSRVWeight = 10

// SRVWeights returns the DNS SRV weight of each of eps (endpoints of s):
// each side of a split shares its percentage among its endpoints, so that
// a resolver choosing by weight sends a side its share; a side at 0% (or
// the old side at 100%) gets 0 and is left out of answers by DNS servers
// that follow WeightedOut. A side without endpoints leaves everything to
// the other.
func (s *Service) SRVWeights(eps []store.Endpoint) []uint16 {
	w := make([]uint16, len(eps))
	var nNew int
	for _, e := range eps {
		if s.IsNew(e) {
			nNew++
		}
	}
	nOld := len(eps) - nNew
	newPct := 0
	if s.Split != nil {
		newPct = min(max(s.Split.Weight, 0), 100)
	}
	switch {
	case nNew == 0:
		newPct = 0
	case nOld == 0:
		newPct = 100
	}
	for i, e := range eps {
		pct, n := 100-newPct, nOld
		if s.IsNew(e) {
			pct, n = newPct, nNew
		}
		switch {
		case s.Split == nil:
			w[i] = unsplitSRVWeight
		case pct > 0:
			// Out of 10,000 per service: fine enough for 1% of one
			// endpoint among a hundred.
			w[i] = uint16(max(1, pct*100/n))
		}
	}
	return w
}
