package projection

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// loadRouting reads the same routing state as store.LoadRouting (the test
// TestLoaderMatchesStore holds it to that) in three stream passes instead of
// two requests and a filtered scan per namespace: the routing stream's last
// sequence first, then every namespace's live final commit through one
// last-per-subject consumer, then every instance record through one watch.
// At 1000 namespaces that is what keeps a cold start near a second.
func loadRouting(ctx context.Context, s *store.Store) (*store.RoutingState, error) {
	info, err := s.Routing.Info(ctx)
	if err != nil {
		return nil, store.Classify(fmt.Errorf("loading routing state: %w", err))
	}
	st := &store.RoutingState{Seq: info.State.LastSeq}

	commits, err := liveCommits(ctx, s)
	if err != nil {
		return nil, err
	}
	insts := make(map[string]map[string]*store.InstanceRecord, len(commits))
	for ns := range commits {
		insts[ns] = make(map[string]*store.InstanceRecord)
	}
	if err := eachInstance(ctx, s, func(ns string, r *store.InstanceRecord) {
		if m, ok := insts[ns]; ok {
			m[r.ID] = r
		}
	}); err != nil {
		return nil, err
	}
	nss := make([]string, 0, len(commits))
	for ns := range commits {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	for _, ns := range nss {
		st.Services = append(st.Services, store.CommitEvents(commits[ns], nil, insts[ns])...)
	}
	err = store.ListJSON(ctx, s.Machines, ">", func(_ string, m *store.MachineRecord) error {
		st.Machines = append(st.Machines, *m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// liveCommits returns the latest final commit of every namespace.
func liveCommits(ctx context.Context, s *store.Store) (map[string]*store.DeployCommit, error) {
	filter := s.Names.DeployCommitSubject("*", store.CommitFinal)
	out := make(map[string]*store.DeployCommit)
	info, err := s.Commits.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, store.Classify(fmt.Errorf("loading live commits: %w", err))
	}
	want := len(info.State.Subjects)
	if want == 0 {
		return out, nil
	}
	cons, err := s.JS.OrderedConsumer(ctx, s.Names.DeployCommitsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, store.Classify(fmt.Errorf("loading live commits: %w", err))
	}
	prefix, suffix := strings.TrimSuffix(filter, "*."+string(store.CommitFinal)), "."+string(store.CommitFinal)
	// Stop at the last message the consumer had pending when it started
	// (NumPending 0): namespaces committed meanwhile come in with events.
	for {
		batch, err := cons.Fetch(max(want-len(out), 1), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, store.Classify(fmt.Errorf("loading live commits: %w", err))
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var c store.DeployCommit
			if err := store.Decode("deploy commit", m.Data(), &c); err != nil {
				return nil, fmt.Errorf("loading live commit on %s: %w", m.Subject(), err)
			}
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("loading live commits: %w", err)
			}
			c.Seq = meta.Sequence.Stream
			out[strings.TrimSuffix(strings.TrimPrefix(m.Subject(), prefix), suffix)] = &c
			if meta.NumPending == 0 {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil {
			return nil, store.Classify(fmt.Errorf("loading live commits: %w", err))
		}
		if n == 0 {
			return nil, store.Errorf(store.CodeUnavailable, "loading live commits: no delivery after 5s (%d of %d namespaces read)", len(out), want)
		}
	}
}

// instanceFields is the part of an instance record routing needs; decoding
// only these skips the timestamps, the costliest fields to parse.
type instanceFields struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	Slot      int    `json:"slot"`
	Revision  int64  `json:"revision"`
	Machine   string `json:"machine"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
	State     string `json:"state"`
	Error     string `json:"error"`
}

// eachInstance calls fn with every instance record and the namespace its
// key is under.
func eachInstance(ctx context.Context, s *store.Store, fn func(ns string, r *store.InstanceRecord)) error {
	w, err := s.Instances.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return store.Classify(fmt.Errorf("loading instances: %w", err))
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return store.Classify(fmt.Errorf("loading instances: %w", ctx.Err()))
		case ent, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("loading instances: watcher closed")
			}
			if ent == nil {
				return nil
			}
			var f instanceFields
			if err := json.Unmarshal(ent.Value(), &f); err != nil {
				return fmt.Errorf("loading instance %s: decoding: %w", ent.Key(), err)
			}
			if f.Version > store.RecordVersion {
				return fmt.Errorf("loading instance %s: record version %d is newer than this build understands (%d)",
					ent.Key(), f.Version, store.RecordVersion)
			}
			ns, _, _ := strings.Cut(ent.Key(), ".")
			fn(ns, &store.InstanceRecord{Version: f.Version, ID: f.ID, Namespace: f.Namespace, Service: f.Service,
				Slot: f.Slot, Revision: f.Revision, Machine: f.Machine, Address: f.Address, Port: f.Port,
				State: f.State, Error: f.Error})
		}
	}
}
