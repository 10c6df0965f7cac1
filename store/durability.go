package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Durability is what a power cut of a storage node may cost a stream or
// bucket: the decision, made per stream and bucket of the layout, of whether
// a write must reach the disk before the store acknowledges it.
type Durability string

const (
	// DurabilitySynced: a write is on disk before it is acknowledged (with
	// the storage node's default sync policy, `control server --sync
	// always`). Intent, records and everything written once or on change
	// only: a lost write is a commit, certificate, claim or key the rest of
	// the fleet was told exists and nobody writes again.
	DurabilitySynced Durability = "synced"
	// DurabilityRewritten: a live observation its writer writes again
	// every few seconds whether or not it changed (heartbeats, gateway
	// reports, liveness judgements, drift reports). On a single storage
	// node it is acknowledged before it is synced (JetStream's async
	// persist mode): a power cut loses the last of them, and the next
	// round replaces them. Replicated streams are always synced (JetStream
	// refuses async persistence on them).
	DurabilityRewritten Durability = "rewritten"
)

// durabilityOf classifies one stream or bucket of s's layout by the field it
// binds to. Every one is named here: an unclassified one ("") is refused by
// Provision, so a new bucket cannot slip in without the decision.
func (s *Store) durabilityOf(dst any) Durability {
	switch dst {
	case &s.commits, &s.routing, &s.renewals,
		&s.certs, &s.certStatus, &s.acmeBudget, &s.locks,
		&s.status, &s.phases, &s.instances, &s.machines, &s.invites,
		&s.meshPeers, &s.meshIPs, &s.meshKeys,
		&s.dashboardTokens, &s.dashboardSessions,
		&s.releases, &s.rollouts, &s.canaryDecisions, &s.canaryKeys,
		&s.revocations, &s.credentials, &s.signers, &s.hosts,
		// Written on change only (an agent's state and observations,
		// the aggregator's summaries): a lost write would stand until
		// the next change.
		&s.machineStates, &s.observed, &s.fleetStatus:
		return DurabilitySynced
	case &s.machineBeats, &s.meshBeats, &s.meshDrift,
		&s.gateways, &s.gatewayTraffic, &s.machineLiveness:
		return DurabilityRewritten
	}
	return ""
}

// persistMode is the JetStream persist mode a stream of durability d gets
// when created on storage nodes that are clustered or not, with replicas.
func persistMode(d Durability, clustered bool, replicas int) jetstream.PersistModeType {
	// A store that is clustered may grow its replicas later (`control
	// storage add`), and JetStream refuses both async persistence on a
	// replicated stream and changing a stream's persist mode.
	if d == DurabilityRewritten && !clustered && replicas == 1 {
		return jetstream.AsyncPersistMode
	}
	return jetstream.DefaultPersistMode
}

// Durabilities is the durability of every stream and bucket of the store,
// by stream name (a bucket's stream is KV_<bucket>).
func (s *Store) Durabilities() map[string]Durability {
	streams, buckets := s.layout()
	out := make(map[string]Durability, len(streams)+len(buckets))
	for _, st := range streams {
		out[st.cfg.Name] = s.durabilityOf(st.dst)
	}
	for _, b := range buckets {
		out["KV_"+b.cfg.Bucket] = s.durabilityOf(b.dst)
	}
	return out
}

// recreateUnsynced replaces old, a synced stream, with one like cfg that is
// not (async persist mode): JetStream cannot change a stream's persist mode,
// and a store provisioned before the durabilities had every stream synced.
// Only rewritten observations are ever unsynced, so what the old stream
// held is dropped and written again by the next round of its writers. The
// new stream goes on at the sequence after the old one's last, so a
// watcher resuming after its last message misses nothing written later.
func recreateUnsynced(ctx context.Context, js jetstream.JetStream, old jetstream.Stream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	info, err := old.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading %s before making it unsynced: %w", cfg.Name, err)
	}
	if err := js.DeleteStream(ctx, cfg.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("making %s unsynced: deleting the synced stream: %w", cfg.Name, err)
	}
	cfg.FirstSeq = info.State.LastSeq + 1
	str, err := js.CreateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("making %s unsynced: recreating it: %w", cfg.Name, err)
	}
	return str, nil
}
