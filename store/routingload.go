package store

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// LoadRouting reads the routing state from stored intent and status: what a
// projection loads before it reads events from Seq+1. The stream position
// is taken first, so replaying events after Seq can only bring the state
// forward. It reads in a few passes rather than a few requests per
// namespace (the routing stream's last sequence, every namespace's live
// final commit in batches of direct gets, every instance and machine record
// in one scan each): at 1000 namespaces that keeps a gateway's cold start
// near a second. Records it cannot use are left out and named in Skipped.
func (s *Store) LoadRouting(ctx context.Context) (*RoutingState, error) {
	info, err := s.Routing.Info(ctx)
	if err != nil {
		return nil, Classify(fmt.Errorf("loading routing state: %w", err))
	}
	st := &RoutingState{Seq: info.State.LastSeq}
	skip := func(key string, err error) { st.Skipped = append(st.Skipped, err.Error()) }

	commits, err := liveCommits(ctx, s, skip)
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
	}, skip); err != nil {
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
	err = ListJSON(ctx, s, s.Machines, ">", func(_ string, m *MachineRecord) error {
		st.Machines = append(st.Machines, *m)
		return nil
	}, OnSkip(skip))
	if err != nil {
		return nil, err
	}
	return st, nil
}

// liveCommits returns the latest final commit of every namespace. A commit
// filed under another namespace's subject is skipped.
func liveCommits(ctx context.Context, s *Store, skip func(string, error)) (map[string]*DeployCommit, error) {
	filter := s.Names.DeployCommitSubject("*", CommitFinal)
	subjects, err := s.SubjectsOf(ctx, s.Names.DeployCommitsStream(), filter)
	if err != nil {
		return nil, fmt.Errorf("loading live commits: %w", err)
	}
	prefix, suffix := strings.TrimSuffix(filter, "*."+string(CommitFinal)), "."+string(CommitFinal)
	out := make(map[string]*DeployCommit, len(subjects))
	err = s.LastOf(ctx, s.Names.DeployCommitsStream(), subjects, func(m *StoredMsg) error {
		ns := strings.TrimSuffix(strings.TrimPrefix(m.Subject, prefix), suffix)
		c, err := decodeCommit(m.Data, m.Seq)
		switch {
		case err != nil:
			skip(m.Subject, fmt.Errorf("live commit on %s: %w", m.Subject, err))
		case c.Namespace != ns || c.Kind != CommitFinal:
			skip(m.Subject, fmt.Errorf("live commit on %s is a %s commit of namespace %q: skipped", m.Subject, c.Kind, c.Namespace))
		default:
			out[ns] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading live commits: %w", err)
	}
	return out, nil
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
func eachInstance(ctx context.Context, s *Store, fn func(ns string, r *InstanceRecord), skip func(string, error)) error {
	err := ListJSON(ctx, s, s.Instances, NamespaceInstancesFilter("*"), func(key string, f *instanceFields) error {
		ns, _, _ := strings.Cut(key, ".")
		fn(ns, &InstanceRecord{Version: f.Version, ID: f.ID, Namespace: f.Namespace, Service: f.Service,
			Slot: f.Slot, Revision: f.Revision, Machine: f.Machine, Address: f.Address, Port: f.Port,
			State: f.State, Error: f.Error})
		return nil
	}, OnSkip(skip))
	if err != nil {
		return fmt.Errorf("loading instances: %w", err)
	}
	return nil
}
