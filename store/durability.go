package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
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
	// periodically whether or not it changed (heartbeats, gateway
	// reports, liveness judgements, drift reports). On a single storage node it is
	// acknowledged before it is synced (JetStream's async persist mode):
	// a power cut loses the last of them, and the next round replaces
	// them. Replicated streams are always synced (JetStream refuses async
	// persistence on them).
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
		// the next change. An agent writes its state and observations
		// again after every reconnect, but a routing derivation or a
		// deploy in the seconds before that would read a lost "ready"
		// as not ready and leave the instance out of routing: so they
		// are synced, although they are the bulk of a busy fleet's
		// writes (one per instance state change) and cost about twice
		// the storage CPU so (README "When the power goes").
		&s.machineStates, &s.observed, &s.fleetStatus,
		// The floor is written once per generation and refuses
		// processes: a lost raise would let in what it refused. The
		// control servers' announcements beside it are a few small
		// writes a minute, not worth a class of their own.
		&s.meta:
		return DurabilitySynced
	case &s.machineBeats, &s.meshBeats, &s.meshDrift,
		&s.gateways, &s.gatewayTraffic, &s.machineLiveness,
		// Access lines are a sample, lossy by design (a gateway drops
		// them past its rate and while the store is away): never a sync
		// per line.
		&s.accessLogs:
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
// Only rewritten observations are ever unsynced. What the old stream held
// (each key's last value, for a bucket) is written into the new one unless
// a writer wrote that key anew meanwhile: its writers write it again, but
// not at once, and read empty meanwhile a machine's heartbeat says it was
// never seen, which the aggregator never judges down. A write to the old stream between the read
// and the delete is lost (the older value comes back), until its writer's
// next round. The new stream goes on at the sequence after the old one's
// last, so a watcher resuming after its last message misses nothing
// written later.
func recreateUnsynced(ctx context.Context, js jetstream.JetStream, old jetstream.Stream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	info, err := old.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading %s before making it unsynced: %w", cfg.Name, err)
	}
	// The copy is a courtesy to readers, not a guarantee (the class
	// allows dropping it all): a read that fails keeps none, rather than
	// keeping the store from starting.
	kept, err := lastOfEachSubject(ctx, old, info.State)
	if err != nil {
		kept = nil
	}
	if err := js.DeleteStream(ctx, cfg.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("making %s unsynced: deleting the synced stream: %w", cfg.Name, err)
	}
	cfg.FirstSeq = info.State.LastSeq + 1
	str, err := js.CreateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("making %s unsynced: recreating it: %w", cfg.Name, err)
	}
	for _, m := range kept {
		// Only where no writer wrote since the recreate (theirs is
		// newer); one that fails is left to its writer, as above.
		_, _ = js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(0))
	}
	return str, nil
}

// lastOfEachSubject reads the last message of each subject str held up to
// st's last sequence, in stream order; delete markers (a bucket's, the
// server's) are left out: a key without a value reads the same as a key
// never written.
func lastOfEachSubject(ctx context.Context, str jetstream.Stream, st jetstream.StreamState) ([]*nats.Msg, error) {
	if st.Msgs == 0 {
		return nil, nil
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	last := map[string]int{}
	var out []*nats.Msg
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		got, done := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			done = md.Sequence.Stream >= st.LastSeq
			msg := &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
			if i, ok := last[msg.Subject]; ok {
				out[i] = nil
			}
			last[msg.Subject] = len(out)
			out = append(out, msg)
			if done {
				break
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if done || got == 0 {
			break
		}
	}
	kept := out[:0]
	for _, m := range out {
		if m != nil && m.Header.Get(kvOperationHeader) == "" && m.Header.Get(jetstream.MarkerReasonHeader) == "" {
			kept = append(kept, m)
		}
	}
	return kept, nil
}
