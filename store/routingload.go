package store

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LoadRouting reads the routing state from stored intent and status: what a
// projection loads before it consumes events from Seq+1. The stream position
// is taken first, so replaying events after Seq can only bring the state
// forward. It reads in three passes rather than a few requests per namespace
// (the routing stream's last sequence, every namespace's live final commit
// through one last-per-subject consumer, every instance record through one
// watch): at 1000 namespaces that keeps a gateway's cold start near a second.
func (s *Store) LoadRouting(ctx context.Context) (*RoutingState, error) {
	info, err := s.Routing.Info(ctx)
	if err != nil {
		return nil, Classify(fmt.Errorf("loading routing state: %w", err))
	}
	st := &RoutingState{Seq: info.State.LastSeq}

	commits, err := liveCommits(ctx, s)
	if err != nil {
		return nil, err
	}
	insts := make(map[string]map[string]*InstanceRecord, len(commits))
	for ns := range commits {
		insts[ns] = make(map[string]*InstanceRecord)
	}
	if err := eachInstance(ctx, s, func(ns string, r *InstanceRecord) {
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
		st.Services = append(st.Services, CommitEvents(commits[ns], nil, insts[ns])...)
	}
	err = ListJSON(ctx, s.Machines, ">", func(_ string, m *MachineRecord) error {
		st.Machines = append(st.Machines, *m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// liveCommits returns the latest final commit of every namespace.
func liveCommits(ctx context.Context, s *Store) (map[string]*DeployCommit, error) {
	filter := s.Names.DeployCommitSubject("*", CommitFinal)
	out := make(map[string]*DeployCommit)
	info, err := s.Commits.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, Classify(fmt.Errorf("loading live commits: %w", err))
	}
	want := len(info.State.Subjects)
	if want == 0 {
		return out, nil
	}
	cons, err := s.JS.OrderedConsumer(ctx, s.Names.DeployCommitsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, Classify(fmt.Errorf("loading live commits: %w", err))
	}
	prefix, suffix := strings.TrimSuffix(filter, "*."+string(CommitFinal)), "."+string(CommitFinal)
	// Stop at the last message the consumer had pending when it started
	// (NumPending 0): namespaces committed meanwhile come in with events.
	for {
		batch, err := PullFresh(ctx, func() (jetstream.MessageBatch, error) {
			return cons.Fetch(max(want-len(out), 1), jetstream.FetchMaxWait(5*time.Second))
		})
		if err != nil {
			return nil, Classify(fmt.Errorf("loading live commits: %w", err))
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var c DeployCommit
			if err := Decode("deploy commit", m.Data(), &c); err != nil {
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
			return nil, Classify(fmt.Errorf("loading live commits: %w", err))
		}
		if n == 0 {
			return nil, Errorf(CodeUnavailable, "loading live commits: no delivery after 5s (%d of %d namespaces read)", len(out), want)
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

func (f *instanceFields) version() int { return f.Version }

// eachInstance calls fn with every instance record and the namespace its
// key ("<namespace>.<machine>.<id>") is under.
func eachInstance(ctx context.Context, s *Store, fn func(ns string, r *InstanceRecord)) error {
	err := ListJSON(ctx, s.Instances, NamespaceInstancesFilter("*"), func(key string, f *instanceFields) error {
		ns, _, _ := strings.Cut(key, ".")
		fn(ns, &InstanceRecord{Version: f.Version, ID: f.ID, Namespace: f.Namespace, Service: f.Service,
			Slot: f.Slot, Revision: f.Revision, Machine: f.Machine, Address: f.Address, Port: f.Port,
			State: f.State, Error: f.Error})
		return nil
	})
	if err != nil {
		return fmt.Errorf("loading instances: %w", err)
	}
	return nil
}
