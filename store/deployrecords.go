package store

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Readers and watches of what a deploy writes and waits on (status.go
// writes it): deploy statuses and phases, the deploy leases, and the
// gateways' reports of what they applied and counted.

// DeployStatuses returns every deploy status of namespace, in no order.
func (s *Store) DeployStatuses(ctx context.Context, namespace string) ([]DeployStatus, error) {
	var out []DeployStatus
	err := s.ListDeployStatus(ctx, namespace+".*", func(st *DeployStatus) error {
		out = append(out, *st)
		return nil
	})
	return out, err
}

// DeployStatusNamespaces lists the namespaces with any deploy status,
// sorted.
func (s *Store) DeployStatusNamespaces(ctx context.Context) ([]string, error) {
	keys, err := s.status.ListKeys(ctx)
	if err != nil {
		return nil, classify(fmt.Errorf("listing deploy status: %w", err))
	}
	seen := map[string]bool{}
	var out []string
	for k := range keys.Keys() {
		ns, _, _ := strings.Cut(k, ".")
		if !seen[ns] {
			seen[ns] = true
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out, nil
}

// DeployPhases returns the phase records of deploy id of namespace, in no
// order.
func (s *Store) DeployPhases(ctx context.Context, namespace, id string) ([]PhaseRecord, error) {
	var out []PhaseRecord
	err := ListJSON(ctx, s, s.phases, namespace+"."+id+".*", func(_ string, p *PhaseRecord) error {
		out = append(out, *p)
		return nil
	})
	return out, err
}

// ListGatewayTraffic calls fn with every gateway's traffic counters; a
// record that does not decode or is filed under another's key is skipped
// (ListJSON).
func (s *Store) ListGatewayTraffic(ctx context.Context, fn func(*GatewayTraffic) error) error {
	return ListJSON(ctx, s, s.gatewayTraffic, ">", func(_ string, g *GatewayTraffic) error { return fn(g) })
}

// WatchDeployLeases follows the namespaces' deploy leases (DeployLockKey):
// changes only, keys without values, so a lease that expires or is
// released shows as a delete.
func (s *Store) WatchDeployLeases(ctx context.Context) (jetstream.KeyWatcher, error) {
	w, err := s.locks.Watch(ctx, DeployLocksFilter, jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return nil, classify(fmt.Errorf("watching deploy leases: %w", err))
	}
	return w, nil
}

// WatchGatewayObservations follows what every gateway reports it applied:
// the current reports, a nil entry once they are all delivered, then each
// change. Decode an entry with DecodeKeyed(Names.GatewaysBucket(), ...):
// a report under another gateway's name does not decode.
func (s *Store) WatchGatewayObservations(ctx context.Context) (jetstream.KeyWatcher, error) {
	w, err := s.gateways.Watch(ctx, ">")
	if err != nil {
		return nil, classify(fmt.Errorf("watching gateway reports: %w", err))
	}
	return w, nil
}
