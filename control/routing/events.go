package routing

import (
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// ServiceUpsert derives the routing upsert of service from the live commit
// and src. It carries the spec's locality, slow start and layer-4 entry
// points, which readers apply per upsert: an upsert without them would put
// the service back to the default policy and close its ports.
func ServiceUpsert(c *store.DeployCommit, service string, src *Source) store.RoutingEvent {
	spec := c.Manifest.Services[service]
	ev := store.RoutingEvent{
		Version: store.RecordVersion, Kind: store.EventServiceUpsert,
		Namespace: c.Namespace, Service: service, DeployID: c.ID, Revision: c.Revision,
		Routes: spec.Routes, HealthPath: spec.Readiness.Path, Locality: spec.Locality, SlowStart: spec.SlowStart,
		Layer4: spec.Layer4, At: time.Now().UTC(),
	}
	for _, slot := range c.SlotsOf(service) {
		if ep, ok := src.Endpoint(slot); ok {
			ev.Endpoints = append(ev.Endpoints, ep)
		}
	}
	return ev
}

// CommitEvents derives every routing event of commit c: an upsert per
// service, and a removal for each service of prev (the commit it replaced,
// may be nil) that c no longer has. Events come in a stable order.
func CommitEvents(c, prev *store.DeployCommit, src *Source) []store.RoutingEvent {
	var names []string
	for name := range c.Manifest.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []store.RoutingEvent
	for _, name := range names {
		out = append(out, ServiceUpsert(c, name, src))
	}
	if prev != nil {
		for _, name := range servicesOnlyIn(prev, c) {
			out = append(out, store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceRemove,
				Namespace: c.Namespace, Service: name, DeployID: c.ID, Revision: c.Revision, At: time.Now().UTC()})
		}
	}
	return out
}

// CanaryEvents derives the routing events of canary step cp over live
// (nil for a namespace's first deploy): a service cp starts new
// instances of is routed to the live commit's instances and cp's, split
// by the step's weight; a service whose instances cp keeps is routed as
// live routes it; a service new in cp gets all its traffic. Routes and
// health paths stay the live commit's until the final commit.
func CanaryEvents(cp, live *store.DeployCommit, src *Source) []store.RoutingEvent {
	var out []store.RoutingEvent
	for _, ev := range CommitEvents(cp, nil, src) {
		if live == nil {
			out = append(out, ev)
			continue
		}
		if _, ok := live.Manifest.Services[ev.Service]; !ok {
			out = append(out, ev)
			continue
		}
		old := ServiceUpsert(live, ev.Service, src)
		oldIDs := map[string]bool{}
		for _, e := range old.Endpoints {
			oldIDs[e.InstanceID] = true
		}
		var fresh []store.Endpoint
		for _, e := range ev.Endpoints {
			if !oldIDs[e.InstanceID] {
				fresh = append(fresh, e)
			}
		}
		if len(fresh) == 0 && !changedSlots(cp, live, ev.Service) {
			out = append(out, old)
			continue
		}
		old.DeployID, old.Revision = cp.ID, cp.Revision
		old.Endpoints = append(old.Endpoints, fresh...)
		old.Split = &store.Split{Deploy: cp.ID, Revision: cp.Revision, From: live.Revision, Weight: cp.Canary.Weight}
		if spec := cp.Manifest.Rollout; spec != nil {
			old.Split.Sticky, old.Split.Match = spec.Sticky, spec.Match
		}
		out = append(out, old)
	}
	return out
}

// changedSlots reports whether cp runs service on instances live does not.
func changedSlots(cp, live *store.DeployCommit, service string) bool {
	ids := map[string]bool{}
	for _, sl := range live.SlotsOf(service) {
		ids[sl.InstanceID] = true
	}
	for _, sl := range cp.SlotsOf(service) {
		if !ids[sl.InstanceID] {
			return true
		}
	}
	return false
}

// servicesOnlyIn names, sorted, the services of a's manifest that b's
// does not have.
func servicesOnlyIn(a, b *store.DeployCommit) []string {
	var only []string
	for name := range a.Manifest.Services {
		if _, ok := b.Manifest.Services[name]; !ok {
			only = append(only, name)
		}
	}
	sort.Strings(only)
	return only
}
