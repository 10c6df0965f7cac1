package store

import "context"

// RoutingRecords reads what namespace's routing is derived from
// (control/routing): its instance records by ID, each as its agent last
// observed it (ListInstances), and the records of the machines they run on
// by ID, read together with the instances' observations (no round trip of
// their own).
func (s *Store) RoutingRecords(ctx context.Context, namespace string) (instances map[string]*InstanceRecord, machines map[string]*MachineRecord, err error) {
	instances, machines = map[string]*InstanceRecord{}, map[string]*MachineRecord{}
	err = s.listInstances(ctx, NamespaceInstancesFilter(namespace), machines, func(_ string, r *InstanceRecord) error {
		instances[r.ID] = r
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return instances, machines, nil
}
