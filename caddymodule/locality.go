package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Locality. A gateway has a region (its app's `region`, else the region
// of the machine it runs beside, else none) and serves a service from the
// first tier of its endpoints (projection.View.Tiers: home, then the other
// regions nearest first, then draining ones) that has an endpoint that can
// serve: on a machine not judged down and passing its probes. Set-aside,
// fail-open and canary sides then apply within that tier as they applied
// to the whole service before; when no tier can serve, the first is
// served anyway (fail open, per tier). A service none of whose endpoints
// is in a tier (strict with none at home, or all in disabled regions) is
// answered 503 with the reason.
//
// What a request needs is derived once per (view, service, home, nearest
// order) and memoised on the Service; a Service outlives views (an
// unchanged one is carried into the next), and its tiers depend on the
// view's machines and region states, so the memo holds the view it was
// derived for and is derived again when the view changed. When no region
// is known anywhere, or every endpoint is at home in an active region,
// the request takes the path it took before regions existed.

// Where the gateway's region came from.
const (
	regionFromConfig  = "config"
	regionFromMachine = "machine"
	regionFromNone    = "none"
)

// homeOf is the gateway's region for view v and where it came from.
type homeOf struct {
	view *projection.View
	// configured is the app's Region it was derived with.
	configured string
	region     string
	source     string
	// regional is set when a region is known anywhere (the gateway's or a
	// machine's or a region state): without one every service is one
	// tier of every endpoint.
	regional bool
}

// home returns the app's region under v, derived once per view.
func (a *App) home(v *projection.View) *homeOf {
	if h := a.shared.home.Load(); h != nil && h.view == v && h.configured == a.Region {
		return h
	}
	h := &homeOf{view: v, configured: a.Region, region: a.Region, source: regionFromConfig}
	if h.region == "" {
		h.source = regionFromNone
		if m, ok := v.Machine(a.GatewayName); ok && m.Region != "" {
			h.region, h.source = m.Region, regionFromMachine
		}
	}
	h.regional = h.region != "" || len(v.KnownRegions()) > 0
	a.shared.home.Store(h)
	return h
}

// RegionFor is the gateway's region under view v: its configured region,
// else its machine's as v has it. A DNS server beside the gateway
// (edgeplane_dns) answers from the same region.
func (a *App) RegionFor(v *projection.View) string { return a.home(v).region }

// NearestRegions is the order of the regions other than the gateway's,
// nearest first by the round trip it measured, and a version that changes
// with the order: a DNS server beside the gateway fails over where the
// gateway does.
func (a *App) NearestRegions() ([]string, uint64) { return a.nearestRegions() }

// tierDials are one tier's endpoints, their dial addresses and, for a
// split service, both sides of the split within the tier.
type tierDials struct {
	region, state string
	sideDials
	sides *[2]sideDials
}

// localPlan is what a request to one service needs under one view, for
// a gateway in home.
type localPlan struct {
	view    *projection.View
	home    string
	nearest uint64
	// whole is set when the tiers are one tier of every endpoint in
	// order: the request is served as if there were no regions.
	whole bool
	tiers []tierDials
	// unavailable, when no tier has an endpoint, is the 503's body and
	// reason the Edgeplane-Reason header carries.
	unavailable, reason string
	// regionOf maps an endpoint's dial address to its region's index in
	// the traffic table, for the per-region counts.
	regionOf map[string]int
}

type planMemo struct{}

// plan returns svc's plan under v for a gateway in h, deriving it when
// the memo on svc was derived for another view, home or nearest order.
func (a *App) plan(v *projection.View, h *homeOf, svc *projection.Service) *localPlan {
	nearest, ver := a.nearestRegions()
	slot := svc.Memo(planMemo{}, func(*projection.Service) any { return new(atomic.Pointer[localPlan]) }).(*atomic.Pointer[localPlan])
	if p := slot.Load(); p != nil && p.view == v && p.home == h.region && p.nearest == ver {
		return p
	}
	p := newPlan(v, h.region, nearest, ver, svc, a.shared.traffic)
	slot.Store(p)
	return p
}

func newPlan(v *projection.View, home string, nearest []string, ver uint64, svc *projection.Service, traffic *trafficTable) *localPlan {
	p := &localPlan{view: v, home: home, nearest: ver, regionOf: make(map[string]int, len(svc.Endpoints))}
	dials := dialsOf(svc)
	for i, e := range svc.Endpoints {
		p.regionOf[dials[i]] = traffic.regionIndex(v.RegionOf(e))
	}
	if v.Local(svc, home) {
		p.whole = true
		return p
	}
	tiers := v.Tiers(svc, home, nearest)
	if len(tiers) == 1 && len(tiers[0].Endpoints) == len(svc.Endpoints) && slices.IsSorted(tiers[0].Endpoints) {
		p.whole = true
		return p
	}
	var fresh []int
	if svc.Split != nil {
		_, fresh = svc.Sides()
	}
	for _, t := range tiers {
		td := tierDials{region: t.Region, state: t.State}
		if svc.Split != nil {
			td.sides = new([2]sideDials)
		}
		for _, j := range t.Endpoints {
			td.dials = append(td.dials, dials[j])
			td.eps = append(td.eps, svc.Endpoints[j])
			if td.sides == nil {
				continue
			}
			side := sideOld
			if _, isNew := slices.BinarySearch(fresh, j); isNew {
				side = sideNew
			}
			td.sides[side].dials = append(td.sides[side].dials, dials[j])
			td.sides[side].eps = append(td.sides[side].eps, svc.Endpoints[j])
		}
		p.tiers = append(p.tiers, td)
	}
	if len(p.tiers) == 0 && len(svc.Endpoints) > 0 {
		p.unavailable, p.reason = unavailableReason(v, home, svc)
	}
	return p
}

// unavailableReason says why none of svc's endpoints is in a tier for a
// gateway in home: the body of its 503 and the Edgeplane-Reason value.
func unavailableReason(v *projection.View, home string, svc *projection.Service) (body, reason string) {
	if svc.Locality.PolicyOrDefault() == store.LocalityStrict {
		switch {
		case home == "":
			return fmt.Sprintf("service unavailable: no instance of %s without a region, and this gateway has none (locality strict)\n", svc.Key()), "locality-strict"
		case v.RegionState(home) == store.RegionDisabled:
			return fmt.Sprintf("service unavailable: region %s is disabled (locality strict for %s)\n", home, svc.Key()), "locality-strict"
		}
		return fmt.Sprintf("service unavailable: no instance of %s in region %s (locality strict)\n", svc.Key(), home), "locality-strict"
	}
	var regions []string
	for _, e := range svc.Endpoints {
		if r := v.RegionOf(e); !slices.Contains(regions, r) {
			regions = append(regions, r)
		}
	}
	slices.Sort(regions)
	return fmt.Sprintf("service unavailable: every instance of %s is in a disabled region (%s)\n", svc.Key(), strings.Join(regions, ", ")), "region-disabled"
}

type dialsMemo struct{}

// dialsOf is the dial address of each of s's endpoints, once per Service.
func dialsOf(s *projection.Service) []string {
	return s.Memo(dialsMemo{}, func(s *projection.Service) any {
		out := make([]string, len(s.Endpoints))
		for i, e := range s.Endpoints {
			out[i] = net.JoinHostPort(e.Address, strconv.Itoa(e.Port))
		}
		return out
	}).([]string)
}

// tierFor picks the tier a request is served from: the first with an
// endpoint that can serve, else the first (fail open); nil when p has
// none.
func (a *App) tierFor(v *projection.View, p *localPlan) *tierDials {
	for i := range p.tiers {
		if a.anyServing(v, p.tiers[i].dials, p.tiers[i].eps) {
			return &p.tiers[i]
		}
	}
	if len(p.tiers) > 0 {
		return &p.tiers[0]
	}
	return nil
}

// countRegion counts r, proxied to dial, under the region of dial's
// machine in the service's per-region counts.
func (a *App) countRegion(r *http.Request, dial string) {
	// Without regions nothing is counted by region: that answer costs
	// less than the request variable.
	v := a.Projection().View()
	h := a.home(v)
	if !h.regional || featuresOff.locality.Load() {
		return
	}
	svc, ok := caddyhttp.GetVar(r.Context(), varService).(*projection.Service)
	if !ok || svc == nil {
		return
	}
	if i, ok := a.plan(v, h, svc).regionOf[dial]; ok {
		a.shared.traffic.of(svc).countRegion(i)
	}
}
