package dnsproj

import (
	"fmt"
	"sort"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Locality. A server has a region (Config.Region) and answers a service's
// name as a gateway in that region routes it: A and AAAA from the first
// of the service's tiers (projection.View.Tiers) that has an endpoint on a
// machine not judged down, else, failing open, from every endpoint of the
// first tier; SRV from every tier that can serve, the tier's index as the
// priority (0: the server's own region), so a client that follows SRV
// falls over in the same order. DNS measures no round trips: after the
// service's Locality.Order the other regions come by name.

// servedTier is the endpoints of one tier the zone answers, sorted by
// slot, with the SRV priority of the tier.
type servedTier struct {
	priority uint16
	eps      []store.Endpoint
}

// servedTiers appends to out (a builder's scratch slice, so the common
// case allocates nothing more than a zone without regions did) the tiers
// the zone answers svc's name with for a server in home, the one its A
// and AAAA records come from first; none when no tier has an endpoint (a
// strict service with none in home).
func servedTiers(v View, svc *projection.Service, home string, nearest []string, out []servedTier) []servedTier {
	if v.Local(svc, home) {
		// One tier of every endpoint: exactly the answers of a zone
		// without regions, and no grouping to pay for.
		live, _ := v.LiveEndpoints(svc)
		if len(live) == 0 {
			return out
		}
		return append(out, servedTier{eps: sortedBySlot(live)})
	}
	tiers := v.Tiers(svc, home, nearest)
	for i, t := range tiers {
		var eps []store.Endpoint
		for _, j := range t.Endpoints {
			e := svc.Endpoints[j]
			if _, down := v.Down(e.Machine); !down {
				eps = append(eps, e)
			}
		}
		if len(eps) > 0 {
			out = append(out, servedTier{priority: uint16(min(i, 0xffff)), eps: sortedBySlot(eps)})
		}
	}
	if len(out) == 0 && len(tiers) > 0 {
		// Every machine of every tier judged down: serve the first tier
		// whole, as a zone without regions serves every endpoint when
		// all are down.
		first := tiers[0]
		eps := make([]store.Endpoint, len(first.Endpoints))
		for k, j := range first.Endpoints {
			eps[k] = svc.Endpoints[j]
		}
		out = append(out, servedTier{eps: sortedBySlot(eps)})
	}
	return out
}

// sortedBySlot returns a sorted copy of eps: the answers' order does not
// depend on the order events came in.
func sortedBySlot(eps []store.Endpoint) []store.Endpoint {
	out := append([]store.Endpoint(nil), eps...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Slot != out[j].Slot {
			return out[i].Slot < out[j].Slot
		}
		return out[i].InstanceID < out[j].InstanceID
	})
	return out
}

// ValidRegion checks a server's region: one DNS label of lower-case
// letters, digits and '-', as the gateway's region is.
func ValidRegion(region string) error {
	if !store.ValidRegion(region) {
		return fmt.Errorf("region %q: not a DNS label (lower-case letters, digits and '-', up to 63)", region)
	}
	return nil
}
