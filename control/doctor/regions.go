package doctor

import (
	"context"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// checkRegions says what the regions change about serving: a region out of
// service (a note), a gateway whose region cannot serve a strict service
// (it answers 503 for it), and a gateway without a region in a fleet whose
// machines have regions (it serves every region alike). A region state
// event that does not verify is found as the routing is read
// (refusedRegion).
func (d *doctor) checkRegions(ctx context.Context) error {
	known := d.view.KnownRegions()
	d.checked(LayerRegions, len(known))
	for _, r := range d.view.RegionRecords() {
		by := ""
		if r.By != "" {
			by = " by " + r.By
		}
		switch r.State {
		case store.RegionDraining:
			d.add(LayerRegions, Note, "region "+r.Name, "draining (set%s at %s): its instances serve only when no other region can, and nothing new is placed there",
				by, r.UpdatedAt.UTC().Format("2006-01-02 15:04:05Z"))
		case store.RegionDisabled:
			d.add(LayerRegions, Note, "region "+r.Name, "disabled (set%s at %s): out of routing and placement",
				by, r.UpdatedAt.UTC().Format("2006-01-02 15:04:05Z"))
		}
	}
	var machineRegions []string
	for _, m := range d.machines {
		if m.Region != "" && !slices.Contains(machineRegions, m.Region) {
			machineRegions = append(machineRegions, m.Region)
		}
	}
	slices.Sort(machineRegions)
	var strict []string
	for _, svc := range d.view.Services() {
		if len(svc.Routes) > 0 && svc.Locality.PolicyOrDefault() == store.LocalityStrict {
			strict = append(strict, svc.Namespace+"/"+svc.Name)
		}
	}
	return d.s.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
		if d.now.Sub(o.At) >= store.GatewayObservationTTL {
			return nil
		}
		subj := "gateway " + o.Gateway
		if o.Region == "" {
			if len(machineRegions) > 0 {
				d.add(LayerRegions, Warning, subj, "has no region while the machines are in %s: it serves every region alike (set region in its edgeplane config)",
					strings.Join(machineRegions, ", "))
			}
			return nil
		}
		for _, name := range strict {
			ns, svcName, _ := strings.Cut(name, "/")
			svc, _ := d.view.Service(ns, svcName)
			if len(d.view.Tiers(svc, o.Region, nil)) > 0 {
				continue
			}
			why := "has no instance there"
			if st := d.view.RegionState(o.Region); st == store.RegionDisabled {
				why = "is disabled"
			}
			d.add(LayerRegions, Warning, subj, "serves %s, whose locality is strict, in region %s, which %s: it answers 503 for it", name, o.Region, why)
		}
		return nil
	})
}

// refusedRegion reports a region state event that does not verify, if the
// refused event r is one: gateways and DNS servers keep the state they had
// (or take the region for active, starting afresh), so the state an
// operator set may not hold.
func (d *doctor) refusedRegion(r store.RefusedEvent) bool {
	region, ok := d.s.Names.RoutingRegionOf(r.Subject)
	if !ok {
		return false
	}
	d.add(LayerRegions, Problem, "region "+region, "its state event (sequence %d) does not verify: %v; readers keep the state they had, one starting now takes the region for active",
		r.Seq, r.Err)
	return true
}
