package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Readers of what the fleet reports and what the control plane makes of
// it: machine heartbeats and states, instance observations, gateways'
// reports and traffic, deploy progress and the namespace summaries. Their
// writers are beside their records (PutMachineBeat, PutNamespaceStatus,
// ...). A watch is handed out as the watcher itself, for a caller that
// follows a bucket (the fleet aggregator, the dashboard); it stops it.

// WatchInstances watches every instance record: their values first, then
// each change.
func (s *Store) WatchInstances(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.instances.WatchAll(ctx, opts...)
}

// WatchObserved watches every machine's observations of its instances
// (MachineObserved).
func (s *Store) WatchObserved(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.observed.WatchAll(ctx, opts...)
}

// WatchMachineBeats watches every machine's heartbeat (MachineBeat).
func (s *Store) WatchMachineBeats(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.machineBeats.WatchAll(ctx, opts...)
}

// WatchGatewayTraffic watches every gateway's traffic report
// (GatewayTraffic).
func (s *Store) WatchGatewayTraffic(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.gatewayTraffic.WatchAll(ctx, opts...)
}

// WatchNamespaceStatus watches every namespace summary (NamespaceStatus).
func (s *Store) WatchNamespaceStatus(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.fleetStatus.WatchAll(ctx, opts...)
}

// PublishFleetStatusFlushed says f to whoever follows the summaries
// (FollowFleetStatusFlushed); nobody following costs nothing but the
// send.
func (s *Store) PublishFleetStatusFlushed(f *FleetStatusFlushed) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encoding the fleet status flush: %w", err)
	}
	if err := s.NC.Publish(s.Names.FleetStatusFlushedSubject(), b); err != nil {
		return classify(fmt.Errorf("publishing the fleet status flush: %w", err))
	}
	return nil
}

// FollowFleetStatusFlushed calls fn with each FleetStatusFlushed published
// from now on, one at a time, until stop is called.
func (s *Store) FollowFleetStatusFlushed(fn func(*FleetStatusFlushed)) (stop func(), err error) {
	sub, err := s.NC.Subscribe(s.Names.FleetStatusFlushedSubject(), func(m *nats.Msg) {
		var f FleetStatusFlushed
		if json.Unmarshal(m.Data, &f) == nil {
			fn(&f)
		}
	})
	if err != nil {
		return nil, classify(fmt.Errorf("following the fleet status flushes: %w", err))
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// WatchDeployStatus follows every deploy's status (DeployStatus): the
// current ones, a nil entry once they are all delivered, then each change
// (unless opts say otherwise). Decode an entry with
// DecodeKeyed(Names.DeployStatusBucket(), ...).
func (s *Store) WatchDeployStatus(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := s.status.WatchAll(ctx, opts...)
	if err != nil {
		return nil, classify(fmt.Errorf("watching deploy status: %w", err))
	}
	return w, nil
}

// WatchPhases watches every deploy phase (PhaseRecord).
func (s *Store) WatchPhases(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return s.phases.WatchAll(ctx, opts...)
}

// MachineBeatOf reads machine id's last heartbeat; a machine never heard
// is not_found.
func (s *Store) MachineBeatOf(ctx context.Context, id string) (*MachineBeat, error) {
	var b MachineBeat
	if _, err := GetJSON(ctx, s.machineBeats, id, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// ListMachineBeats calls fn with every machine's heartbeat (ListJSON).
func (s *Store) ListMachineBeats(ctx context.Context, fn func(*MachineBeat) error) error {
	return ListJSON(ctx, s, s.machineBeats, ">", func(_ string, b *MachineBeat) error { return fn(b) })
}

// MachineStateOf reads what machine id's agent last reported of it; none
// is not_found.
func (s *Store) MachineStateOf(ctx context.Context, id string) (*MachineState, error) {
	var st MachineState
	if _, err := GetJSON(ctx, s.machineStates, id, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// NamespaceStatusOf reads namespace ns's summary; none yet is not_found.
func (s *Store) NamespaceStatusOf(ctx context.Context, ns string) (*NamespaceStatus, error) {
	var st NamespaceStatus
	if _, err := GetJSON(ctx, s.fleetStatus, ns, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ListNamespaceStatus calls fn with every namespace summary (ListJSON).
func (s *Store) ListNamespaceStatus(ctx context.Context, fn func(*NamespaceStatus) error) error {
	return ListJSON(ctx, s, s.fleetStatus, ">", func(_ string, st *NamespaceStatus) error { return fn(st) })
}

// ListDeployStatus calls fn with the status of every deploy whose key
// (DeployStatusKey) matches filter (ListJSON).
func (s *Store) ListDeployStatus(ctx context.Context, filter string, fn func(*DeployStatus) error) error {
	return ListJSON(ctx, s, s.status, filter, func(_ string, st *DeployStatus) error { return fn(st) })
}

// ListGatewayObservations calls fn with every gateway's last routing
// report that has not aged out of the store (ListJSON).
func (s *Store) ListGatewayObservations(ctx context.Context, fn func(*GatewayObservation) error) error {
	return ListJSON(ctx, s, s.gateways, ">", func(_ string, o *GatewayObservation) error { return fn(o) })
}

// RoutingInfo is the routing stream's info: its head (State.LastSeq) and
// its creation time, the stream's identity.
func (s *Store) RoutingInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	return s.routing.Info(ctx)
}

// RoutingMsg reads the routing stream's message at seq, as stored
// (unverified): for its time, say.
func (s *Store) RoutingMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return s.routing.GetMsg(ctx, seq)
}
