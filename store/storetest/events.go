package storetest

import (
	"context"
	"slices"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Events returns the routing events the control plane publishes for final
// commit c, which replaced prev (nil for a namespace's first), over the
// namespace's instance and machine records by ID: an upsert per service
// with the endpoints of its routable slots, then a removal per service of
// prev that c dropped, each in name order. The rule is control/routing's
// (Routable, Source.Endpoint, CommitEvents), written out again because
// storetest sits below the control plane; control/routing's
// TestFixtureEventsAreTheControlPlanes holds both to the same events.
func Events(c, prev *store.DeployCommit, instances map[string]*store.InstanceRecord, machines map[string]*store.MachineRecord) []store.RoutingEvent {
	var out []store.RoutingEvent
	for _, name := range sortedServices(c) {
		out = append(out, upsert(c, name, instances, machines))
	}
	if prev != nil {
		for _, name := range sortedServices(prev) {
			if _, ok := c.Manifest.Services[name]; !ok {
				out = append(out, store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceRemove,
					Namespace: c.Namespace, Service: name, DeployID: c.ID, Revision: c.Revision, At: time.Now().UTC()})
			}
		}
	}
	return out
}

func sortedServices(c *store.DeployCommit) []string {
	var names []string
	for name := range c.Manifest.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// upsert is the upsert of service under c: an endpoint for each slot whose
// instance is the slot's, ready, without error, with a port, on a machine
// with an admitted address (reached there, at the instance's port).
func upsert(c *store.DeployCommit, service string, instances map[string]*store.InstanceRecord, machines map[string]*store.MachineRecord) store.RoutingEvent {
	spec := c.Manifest.Services[service]
	ev := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: c.Namespace,
		Service: service, DeployID: c.ID, Revision: c.Revision, Routes: spec.Routes, HealthPath: spec.Readiness.Path,
		Locality: spec.Locality, SlowStart: spec.SlowStart, Layer4: spec.Layer4, At: time.Now().UTC()}
	for _, slot := range c.SlotsOf(service) {
		in := instances[slot.InstanceID]
		if in == nil || in.State != store.InstanceReady || in.Error != "" || in.Port <= 0 || in.Port > 65535 ||
			in.ID != slot.InstanceID || in.Machine != slot.Machine || in.Revision != slot.Revision {
			continue
		}
		m := machines[in.Machine]
		if m == nil || m.ID != in.Machine || m.Address == "" {
			continue
		}
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: in.ID, Machine: in.Machine, Slot: slot.Slot,
			Revision: in.Revision, Address: m.Address, Port: in.Port})
	}
	return ev
}

// republish publishes the upsert of service derived from the live commit
// of namespace and the records now stored, as the control plane does when
// an agent asks it to (control/routing.RepublishService; these fixtures
// run no canary). A service the live commit does not have publishes
// nothing.
func republish(ctx context.Context, s *store.Store, namespace, service string) (uint64, error) {
	live, err := s.LiveCommit(ctx, namespace)
	if err != nil {
		return 0, err
	}
	if _, ok := live.Manifest.Services[service]; !ok {
		return 0, nil
	}
	insts, machines, err := s.RoutingRecords(ctx, namespace)
	if err != nil {
		return 0, err
	}
	return s.PublishRouting(ctx, "", []store.RoutingEvent{upsert(live, service, insts, machines)})
}
