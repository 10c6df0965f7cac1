package deploy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// Layer 4 in a deploy: a manifest exposing layer-4 entry points is
// refused while a gateway too old to serve them is live, and an instance
// that leaves routing is stopped only once the gateways' layer-4
// connections to it have drained (or its service's drain timeout, plus a
// margin, has passed).

// L4DrainMargin is how long past a service's drain timeout a deploy waits
// for the gateways to report its drains over: a gateway ends a drain at
// the timeout and says so at its next observation.
const L4DrainMargin = 5 * time.Second

// gatewaysServeLayer4 refuses, with version_skew, a manifest exposing any
// layer-4 entry point while a live gateway runs a generation before
// layer 4: it would route the service's HTTP and leave its ports and
// passthrough hosts unserved, and no report would say so. Rollbacks too:
// an entry point the fleet cannot serve is as unserved on the way back.
func gatewaysServeLayer4(live []routing.LiveGateway, m *store.Manifest) error {
	entries := manifest.Layer4Entries(m)
	if len(entries) == 0 {
		return nil
	}
	old := routing.Below(live, store.GenerationLayer4)
	if len(old) == 0 {
		return nil
	}
	var named []string
	for _, path := range slices.Sorted(maps.Keys(entries)) {
		named = append(named, fmt.Sprintf("%s (%s)", path, entries[path]))
	}
	return store.Errorf(store.CodeVersionSkew, "gateways %s cannot serve layer-4 entry points (release %s or later can), and this manifest exposes %s: upgrade them first (control fleet upgrade)",
		strings.Join(old, ", "), store.FirstReleaseOf(store.GenerationLayer4), strings.Join(named, ", ")).
		With("gateways", strings.Join(old, ",")).With("entries", strings.Join(named, ","))
}

// l4Stop is an instance about to be stopped whose service exposes layer-4
// entry points, and how long its drains are waited for.
type l4Stop struct {
	service string
	bound   time.Duration
}

// layer4Stops picks, of the instances (ID → service) about to stop, those
// whose service has layer-4 entry points in any of manifests (the commit
// they leave and the one that replaces it), each with the longest of its
// service's drain timeouts plus L4DrainMargin.
func layer4Stops(insts map[string]string, manifests ...*store.Manifest) map[string]l4Stop {
	out := map[string]l4Stop{}
	for id, svc := range insts {
		for _, m := range manifests {
			if m == nil {
				continue
			}
			spec, ok := m.Services[svc]
			if !ok || spec.Layer4.Empty() {
				continue
			}
			if b := spec.Drain() + L4DrainMargin; b > out[id].bound {
				out[id] = l4Stop{service: svc, bound: b}
			}
		}
	}
	return out
}

// waitLayer4Drains waits until no live gateway whose observation is at or
// after routing sequence seq lists any of stops (ns's instances) in its
// L4Draining, each instance for at most its bound. A gateway behind seq
// is left out: it was waited for (and warned about) before, and still
// routes to the instance whatever is waited here. It prints what it
// waits for, and returns what was still draining when it stopped waiting
// (one line each), for the caller's warnings; never an error: the
// instances stop anyway.
func (d *Deployer) waitLayer4Drains(ctx context.Context, ns string, seq uint64, stops map[string]l4Stop) []string {
	if len(stops) == 0 {
		return nil
	}
	var longest time.Duration
	byService := map[string][]string{}
	for id, st := range stops {
		longest = max(longest, st.bound)
		byService[st.service] = append(byService[st.service], id)
	}
	for _, svc := range slices.Sorted(maps.Keys(byService)) {
		ids := byService[svc]
		slices.Sort(ids)
		d.printf("       waiting up to %s for gateways' layer-4 connections to %s of %s/%s to drain", stops[ids[0]].bound, strings.Join(ids, ", "), ns, svc)
	}
	start := time.Now()
	var draining []string
	routing.WatchGateways(ctx, d.s, longest, func(obs map[string]store.GatewayObservation) bool {
		draining = draining[:0]
		pending := false
		for _, g := range obs {
			if g.AppliedSeq < seq {
				continue
			}
			for _, dr := range g.L4Draining {
				st, ok := stops[dr.Instance]
				if !ok || dr.Namespace != ns {
					continue
				}
				draining = append(draining, fmt.Sprintf("%s of %s/%s: %d connections through gateway %s", dr.Instance, ns, st.service, dr.Conns, g.Gateway))
				if time.Since(start) < st.bound {
					pending = true
				}
			}
		}
		return !pending
	})
	slices.Sort(draining)
	if len(draining) == 0 {
		d.printf("       layer-4 connections drained after %s", time.Since(start).Round(time.Millisecond))
	}
	return draining
}

// maxL4Bound is the longest a drain of m's services is waited for: the
// longest drain timeout plus L4DrainMargin, zero when m exposes nothing
// below HTTP.
func maxL4Bound(m *store.Manifest) time.Duration {
	var out time.Duration
	for _, spec := range m.Services {
		if !spec.Layer4.Empty() {
			out = max(out, spec.Drain()+L4DrainMargin)
		}
	}
	return out
}

// startedServices are the candidates this apply started, by instance ID.
func (r *run) startedServices() map[string]string {
	out := make(map[string]string, len(r.started))
	for _, a := range r.started {
		out[a.InstanceID] = a.Service
	}
	return out
}
