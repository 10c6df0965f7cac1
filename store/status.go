package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Durable status of deploys (written by the control role) and the live
// observations of the fleet: each write keys the record by what its body
// names.

// DeployStatusKey is a deploy's key in the status bucket:
// "<namespace>.<deploy id>".
func DeployStatusKey(namespace, deployID string) string { return namespace + "." + deployID }

// PhaseKey is a deploy phase's key in the phases bucket:
// "<namespace>.<deploy id>.<index>".
func PhaseKey(namespace, deployID string, index int) string {
	return fmt.Sprintf("%s.%s.%d", namespace, deployID, index)
}

// GatewayKey is a gateway's key in the gateways bucket.
func GatewayKey(name string) string { return KeySafe(name) }

// PutDeployStatus writes st, stamped now.
func (s *Store) PutDeployStatus(ctx context.Context, st *DeployStatus) error {
	st.Version, st.UpdatedAt = RecordVersion, time.Now().UTC()
	_, err := PutJSON(ctx, s.status, DeployStatusKey(st.Namespace, st.DeployID), st)
	return err
}

// PutPhase writes one phase record of a deploy, stamped now.
func (s *Store) PutPhase(ctx context.Context, p *PhaseRecord) error {
	p.Version, p.UpdatedAt = RecordVersion, time.Now().UTC()
	_, err := PutJSON(ctx, s.phases, PhaseKey(p.Namespace, p.DeployID, p.Index), p)
	return err
}

// PutGatewayObservation writes what gateway o.Gateway applied.
func (s *Store) PutGatewayObservation(ctx context.Context, o *GatewayObservation) error {
	o.Version = RecordVersion
	o.Release, o.Generation = Announcement()
	_, err := PutJSON(ctx, s.gateways, GatewayKey(o.Gateway), o)
	return err
}

// PutNamespaceStatus writes a namespace's fleet summary; one with no
// instances left is deleted instead.
func (s *Store) PutNamespaceStatus(ctx context.Context, st *NamespaceStatus) error {
	if st.Counts.Total() == 0 {
		if err := s.fleetStatus.Delete(ctx, st.Namespace); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return classify(fmt.Errorf("deleting the summary of %s: %w", st.Namespace, err))
		}
		return nil
	}
	st.Version = RecordVersion
	_, err := PutJSON(ctx, s.fleetStatus, st.Namespace, st)
	return err
}
