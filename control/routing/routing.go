// Package routing derives the routing events the control plane publishes
// from the records the store holds: the events a final commit, a canary
// step or its abort implies, and what a republish of one service
// publishes. The store signs, seals, publishes and reads those events and
// the records; it decides none of what follows, which gateways and DNS
// act on:
//
//   - which instance is routable under a committed slot (Routable): ready,
//     no error, a port, and the very instance, machine and revision the
//     slot names;
//   - where an endpoint is reached (Source.Endpoint): its machine's
//     admitted address and the instance's port, never the address an
//     agent wrote;
//   - what a commit publishes (CommitEvents): an upsert per service, a
//     removal per service the commit dropped;
//   - what a canary step publishes (CanaryEvents): a changed service split
//     between the live instances and the candidates by the step's weight;
//   - which commit routes a namespace now (Commits): a canary step under
//     way, else the live commit; a republish (RepublishService) publishes
//     what it implies;
//   - which agent may ask for a republish of what (ServeRepublish): only
//     of a service its machine runs, and derived from stored state alone.
//   - when the gateways serve a routing sequence (WaitApplied): every
//     gateway whose report has not aged out applied it; what a live
//     gateway is (WatchGateways) for any other wait on their reports;
//   - which live gateways are too old for a generation's writes
//     (GatewaysBelow), for version_skew refusals;
//   - how a namespace's routing is carried (Publish): one routing batch
//     (every service the namespace routes, applied in one view swap, the
//     namespace's whole state for a cold start) while every live gateway
//     reads batches, one message per service otherwise; a canary step's
//     batch holds the services only the live commit has (CanaryBatch).
package routing

import (
	"context"

	"github.com/edgeplane/edgeplane/store"
)

// Routable reports whether inst may receive traffic under slot: ready, not
// draining, no unrecovered error, a port, and the very instance, machine
// and revision the committed slot names. There is no grace period. Where
// it is reached is its machine's business (Source.Endpoint).
func Routable(inst *store.InstanceRecord, slot store.SlotAssignment) bool {
	return inst != nil &&
		inst.State == store.InstanceReady &&
		inst.Error == "" &&
		inst.Port > 0 &&
		inst.ID == slot.InstanceID &&
		inst.Machine == slot.Machine &&
		inst.Revision == slot.Revision
}

// Source is what a namespace's routing is derived from: its instance
// records by ID, as their agents last observed them, and the records of
// the machines they run on by ID. An endpoint's IP is its machine's
// admitted address; the agent names only the port.
type Source struct {
	Instances map[string]*store.InstanceRecord
	Machines  map[string]*store.MachineRecord
}

// SourceOf reads what namespace's routing is derived from
// (store.RoutingRecords).
func SourceOf(ctx context.Context, s *store.Store, namespace string) (*Source, error) {
	insts, machines, err := s.RoutingRecords(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return &Source{Instances: insts, Machines: machines}, nil
}

// Endpoint is the endpoint of inst routed under slot, if it is routable
// and its machine is a member with an address: the machine's admitted
// address and the instance's port. The address the agent wrote in its
// instance record is never used: an agent's credentials write that
// record, and must not decide where gateways send traffic.
func (src *Source) Endpoint(slot store.SlotAssignment) (store.Endpoint, bool) {
	inst := src.Instances[slot.InstanceID]
	if !Routable(inst, slot) || inst.Port > 65535 {
		return store.Endpoint{}, false
	}
	m := src.Machines[inst.Machine]
	if m == nil || m.ID != inst.Machine || m.Address == "" {
		return store.Endpoint{}, false
	}
	return store.Endpoint{InstanceID: inst.ID, Machine: inst.Machine, Slot: slot.Slot, Revision: inst.Revision,
		Address: m.Address, Port: inst.Port}, true
}
