package storetest

// Deploys written into a real store the way `control deploy apply` writes
// them (a final commit, instance records, the derived routing events), so
// tests of the projection, the gateway and DNS can drive them without the
// control binary.

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Instance is one instance of a deployed service.
type Instance struct {
	ID      string
	Machine string
	// Address is where its machine is admitted: Prepare records the
	// machine there (its endpoints are reached at the machine's address,
	// so the instances of one machine share one).
	Address string
	Port    int
	// State defaults to store.InstanceReady.
	State store.InstanceState
	Error string
}

// Service is one service of a deploy: its routes and instances.
type Service struct {
	Routes    []store.Route
	Instances []Instance
	// HealthPath is the service's readiness path, which gateways probe.
	HealthPath string
	// Layer4 is what the service exposes below HTTP.
	Layer4 store.Layer4
}

// Deploy appends a final commit of namespace with services at the next
// revision, writes every instance record, and publishes the routing events
// derived from the commit (upserts, and removals of services the previous
// commit had). It returns the commit and the last routing sequence.
func Deploy(ctx context.Context, s *store.Store, namespace string, services map[string]Service) (*store.DeployCommit, uint64, error) {
	p, err := Prepare(ctx, s, namespace, services)
	if err != nil {
		return nil, 0, err
	}
	seq, err := p.Commit(ctx)
	if err != nil {
		return nil, 0, err
	}
	return p.Deploy, seq, nil
}

// Pending is a deploy whose instances are written and ready but whose
// final commit is not appended yet: the state just before the point of no
// return.
type Pending struct {
	s    *store.Store
	prev *store.DeployCommit
	// insts and machines are the records Commit's events are derived
	// from, by ID.
	insts    map[string]*store.InstanceRecord
	machines map[string]*store.MachineRecord
	// Deploy is the final commit Commit appends.
	Deploy *store.DeployCommit
}

// Prepare records the machines of a deploy of services at their
// instances' addresses (AdmitMachine), writes the instance records and
// builds its final commit at the next revision, without appending it.
func Prepare(ctx context.Context, s *store.Store, namespace string, services map[string]Service) (*Pending, error) {
	var prev *store.DeployCommit
	if c, err := s.LiveCommit(ctx, namespace); err == nil {
		prev = c
	} else if !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	rev := int64(1)
	if prev != nil {
		rev = prev.Revision + 1
	}
	c := &store.DeployCommit{
		ID: fmt.Sprintf("%s-r%d-%d", namespace, rev, time.Now().UnixNano()), Namespace: namespace,
		Kind: store.CommitFinal, Revision: rev, CreatedAt: time.Now().UTC(),
		Manifest: store.Manifest{Namespace: namespace, Services: map[string]store.ServiceSpec{}},
	}
	names := make([]string, 0, len(services))
	for name := range services {
		names = append(names, name)
	}
	sort.Strings(names)
	insts, machines := map[string]*store.InstanceRecord{}, map[string]*store.MachineRecord{}
	for _, name := range names {
		for _, in := range services[name].Instances {
			if m := machines[in.Machine]; m != nil && m.Address != in.Address {
				return nil, fmt.Errorf("machine %s has instances at %s and %s: a machine has one address", in.Machine, m.Address, in.Address)
			}
			m, err := AdmitMachine(ctx, s, in.Machine, in.Address)
			if err != nil {
				return nil, err
			}
			machines[in.Machine] = m
		}
	}
	for _, name := range names {
		svc := services[name]
		n := len(svc.Instances)
		c.Manifest.Services[name] = store.ServiceSpec{Command: []string{"app"}, Replicas: &n, Routes: svc.Routes,
			Readiness: store.Readiness{Path: svc.HealthPath}, Layer4: svc.Layer4}
		for i, in := range svc.Instances {
			c.Slots = append(c.Slots, store.SlotAssignment{Service: name, Slot: i, InstanceID: in.ID,
				Machine: in.Machine, Revision: rev})
			state := in.State
			if state == "" {
				state = store.InstanceReady
			}
			rec := &store.InstanceRecord{Version: store.RecordVersion, ID: in.ID, Namespace: namespace,
				Service: name, Slot: i, Revision: rev, DeployID: c.ID, Machine: in.Machine,
				Address: in.Address, Port: in.Port, State: state, Error: in.Error, Driver: "test",
				CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
			if _, err := s.PutInstance(ctx, rec); err != nil {
				return nil, err
			}
			insts[in.ID] = rec
		}
	}
	return &Pending{s: s, prev: prev, insts: insts, machines: machines, Deploy: c}, nil
}

// Commit appends the final commit and publishes its routing events, as
// `control deploy apply` does after the phase work. It returns the last
// routing sequence.
func (p *Pending) Commit(ctx context.Context) (uint64, error) {
	if _, err := p.s.AppendCommit(ctx, p.Deploy); err != nil {
		return 0, err
	}
	return p.s.PublishRouting(ctx, p.Deploy.ID, Events(p.Deploy, p.prev, p.insts, p.machines))
}

// AdmitMachine records machine id at address as admission and the
// operator do (control/machines): a machine record, and a machine upsert
// published so that projections know where its endpoints may be. A
// machine already recorded there is left as it is; one recorded elsewhere
// is moved.
func AdmitMachine(ctx context.Context, s *store.Store, id, address string) (*store.MachineRecord, error) {
	cur, rev, err := s.GetMachine(ctx, id)
	now := time.Now().UTC()
	switch {
	case err == nil && cur.Address == address:
		return cur, nil
	case err == nil:
		cur.Address, cur.UpdatedAt = address, now
		err = s.UpdateMachine(ctx, cur, rev)
	case store.HasCode(err, store.CodeNotFound):
		cur = &store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive, Address: address, JoinedAt: now, UpdatedAt: now}
		err = s.CreateMachine(ctx, cur)
	}
	if err != nil {
		return nil, err
	}
	if _, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: cur, At: now}}); err != nil {
		return nil, err
	}
	return cur, nil
}

// SetInstance changes one instance record's state and error and publishes
// the fresh upsert of its service, as an agent does when an instance starts
// draining or fails. It returns the routing sequence of the upsert.
func SetInstance(ctx context.Context, s *store.Store, namespace, id string, state store.InstanceState, errText string) (uint64, error) {
	// The key names the machine too; find the record by namespace and ID.
	var rec *store.InstanceRecord
	err := s.ListInstances(ctx, store.InstanceFilter(namespace, id), func(_ string, r *store.InstanceRecord) error {
		rec = r
		return nil
	})
	if err != nil {
		return 0, err
	}
	if rec == nil {
		return 0, store.Errorf(store.CodeNotFound, "no instance %s in namespace %s", id, namespace)
	}
	rec.State, rec.Error, rec.UpdatedAt = state, errText, time.Now().UTC()
	if _, err := s.PutInstance(ctx, rec); err != nil {
		return 0, err
	}
	return republish(ctx, s, namespace, rec.Service)
}

// Refused returns why LoadRouting on s leaves subject out (the reason a
// verification failure names), "" when it does not.
func Refused(t testing.TB, ctx context.Context, s *store.Store, subject string) string {
	t.Helper()
	rs, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs.Refused {
		if r.Subject == subject {
			return store.AsError(r.Err).Detail["reason"]
		}
	}
	return ""
}
