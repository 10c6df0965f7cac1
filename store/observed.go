package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
)

// An agent records what it sees of its instances (ready, in backoff,
// restarted, draining) in one record per machine, MachineObserved, not one
// write per instance and transition: the changes that come together (an
// apply's instances turning ready, every instance of a machine backing off
// at once) cost one write. The instance records stay the durable status:
// what an apply starts and stops, and an instance's end for good. A reader
// takes an instance's state from whichever of the two is newer
// (MachineObserved.Apply); ListInstances and NamespaceInstances do so for
// every reader of instance states.

// ObservedInstance is an agent's last observation of one instance it runs:
// the fields of its InstanceRecord that change while it runs.
type ObservedInstance struct {
	Namespace string        `json:"namespace"`
	State     InstanceState `json:"state"`
	Error     string        `json:"error,omitempty"`
	PID       int           `json:"pid,omitempty"`
	Container string        `json:"container,omitempty"`
	Restarts  int           `json:"restarts,omitempty"`
	LastExit  string        `json:"last_exit,omitempty"`
	// The times of a backoff; UpdatedAt orders the observation against
	// the instance record (the same agent's clock writes both).
	LastExitAt  time.Time `json:"last_exit_at,omitzero"`
	NextRestart time.Time `json:"next_restart,omitzero"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// Observe is what rec says of its instance's run.
func Observe(rec *InstanceRecord) ObservedInstance {
	return ObservedInstance{Namespace: rec.Namespace, State: rec.State, Error: rec.Error, PID: rec.PID, Container: rec.Container,
		Restarts: rec.Restarts, LastExit: rec.LastExit, LastExitAt: rec.LastExitAt, NextRestart: rec.NextRestart, UpdatedAt: rec.UpdatedAt}
}

// MachineObserved is what one machine's agent last saw of every instance
// it runs. Key: the machine ID.
type MachineObserved struct {
	Version   int                         `json:"version"`
	Machine   string                      `json:"machine"`
	Instances map[string]ObservedInstance `json:"instances"`
	UpdatedAt time.Time                   `json:"updated_at"`
}

func (r *MachineObserved) version() int { return r.Version }

// KeyOK checks that the observations are filed under their machine.
func (r *MachineObserved) KeyOK(key string) error { return keyMust(key, r.Machine) }

// Apply makes rec say what r observed of its instance when that is newer
// than rec. Only an observation by the machine
// rec names, of an instance of rec's namespace, is taken: an agent's
// credentials write its own machine's key only, so one machine cannot
// speak for another's instances.
func (r *MachineObserved) Apply(rec *InstanceRecord) {
	if r == nil || rec.Machine != r.Machine {
		return
	}
	o, ok := r.Instances[rec.ID]
	if !ok || o.Namespace != rec.Namespace || !o.UpdatedAt.After(rec.UpdatedAt) {
		return
	}
	rec.State, rec.Error, rec.PID, rec.Container, rec.Restarts = o.State, o.Error, o.PID, o.Container, o.Restarts
	rec.LastExit, rec.LastExitAt, rec.NextRestart, rec.UpdatedAt = o.LastExit, o.LastExitAt, o.NextRestart, o.UpdatedAt
}

// PutObserved writes a machine's observations and returns the revision.
func (s *Store) PutObserved(ctx context.Context, o *MachineObserved) (uint64, error) {
	o.Version = RecordVersion
	rev, err := PutJSON(ctx, s.observed, o.Machine, o)
	if err != nil {
		return 0, fmt.Errorf("observations of machine %s: %w", o.Machine, err)
	}
	return rev, nil
}

// keysAtOnce is how many keys a read of a few records sends as one get
// each, all at once (one round trip, no JetStream API request); more are
// read in multi-subject batches.
const keysAtOnce = 32

// lastOfKeys reads the records of keys in kv (bucket its name) and calls
// keep with each found, concurrently. An apply's namespace runs on a few
// machines: their records are as many key gets, sent together, never one
// after another (ten in turn cost a busy store most of a second); more
// are read in multi-subject batches.
func lastOfKeys[T any, P interface {
	*T
	record
}](ctx context.Context, s *Store, kv jetstream.KeyValue, bucket string, keys map[string]bool, keep func(*T)) error {
	var mu sync.Mutex
	found := func(v *T) {
		mu.Lock()
		defer mu.Unlock()
		keep(v)
	}
	if len(keys) <= keysAtOnce {
		var g errgroup.Group
		for k := range keys {
			g.Go(func() error {
				v := new(T)
				_, err := GetJSON(ctx, kv, k, P(v))
				switch {
				case err == nil:
					found(v)
				case !HasCode(err, CodeNotFound):
					return err
				}
				return nil
			})
		}
		return g.Wait()
	}
	prefix := "$KV." + bucket + "."
	subjects := make([]string, 0, len(keys))
	for k := range keys {
		subjects = append(subjects, prefix+k)
	}
	return s.LastOf(ctx, "KV_"+bucket, subjects, func(m *StoredMsg) error {
		if m.Header.Get(kvOperationHeader) != "" {
			return nil // deleted
		}
		v := new(T)
		if err := DecodeKeyed(bucket, strings.TrimPrefix(m.Subject, prefix), m.Data, P(v)); err != nil {
			SkippedRecords.Add(1)
			return nil
		}
		found(v)
		return nil
	})
}

// ListInstances calls fn with every instance record under filter (a key
// filter, see InstanceKey), each as its machine's agent last observed it:
// the record, or its machine's newer observation.
func (s *Store) ListInstances(ctx context.Context, filter string, fn func(key string, r *InstanceRecord) error) error {
	return s.listInstances(ctx, filter, nil, fn)
}

// listInstances is ListInstances; with machines set, it also reads the
// records of the machines the instances run on into it, together with
// their observations.
func (s *Store) listInstances(ctx context.Context, filter string, machines map[string]*MachineRecord, fn func(key string, r *InstanceRecord) error) error {
	type keyed struct {
		key string
		rec *InstanceRecord
	}
	var recs []keyed
	ids := map[string]bool{}
	if err := ListJSON(ctx, s, s.instances, filter, func(key string, r *InstanceRecord) error {
		recs = append(recs, keyed{key, r})
		ids[r.Machine] = true
		return nil
	}); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	obs := make(map[string]*MachineObserved, len(ids))
	var g errgroup.Group
	g.Go(func() error {
		err := lastOfKeys(ctx, s, s.observed, s.Names.ObservedBucket(), ids, func(o *MachineObserved) { obs[o.Machine] = o })
		if err != nil {
			return fmt.Errorf("reading instance observations: %w", err)
		}
		return nil
	})
	if machines != nil {
		g.Go(func() error {
			err := lastOfKeys(ctx, s, s.machines, s.Names.MachinesBucket(), ids, func(m *MachineRecord) { machines[m.ID] = m })
			if err != nil {
				return fmt.Errorf("reading the machines of instances: %w", err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, k := range recs {
		obs[k.rec.Machine].Apply(k.rec)
		if err := fn(k.key, k.rec); err != nil {
			return err
		}
	}
	return nil
}

// CurrentInstance reads the instance record under key (InstanceKey) as its
// machine's agent last observed it; GetInstance reads the record alone.
func (s *Store) CurrentInstance(ctx context.Context, key string) (*InstanceRecord, error) {
	rec, _, err := s.GetInstance(ctx, key)
	if err != nil {
		return nil, err
	}
	var obs *MachineObserved
	err = lastOfKeys(ctx, s, s.observed, s.Names.ObservedBucket(), map[string]bool{rec.Machine: true}, func(o *MachineObserved) { obs = o })
	if err != nil {
		return nil, fmt.Errorf("reading instance observations: %w", err)
	}
	obs.Apply(rec)
	return rec, nil
}
