package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Machine observations, split by how often they change: the MachineRecord is the
// machine's info (the operator's, rarely changes); MachineState is what its
// agent runs and can take, written when that changes; MachineBeat is a
// small, frequent heartbeat. Liveness is computed from the last beat when
// read, never stored as a fact. Agents write their own machine's keys only.

// MachineState is what one machine's agent runs and can take. Key: the
// machine ID.
type MachineState struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	// Instances counts what the agent holds, ByState by instance state.
	Instances int            `json:"instances"`
	ByState   map[string]int `json:"by_state,omitempty"`
	// Free is how many more instances it accepts; Capacity its maximum.
	Free     int      `json:"free"`
	Capacity int      `json:"capacity"`
	Drivers  []string `json:"drivers,omitempty"`
	// Restarts counts restarts since the agent started.
	Restarts  uint64    `json:"restarts,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Release is the agent's version (control version), Arch its
	// GOOS/GOARCH; Upgrade its latest upgrade, if any.
	Release string         `json:"release,omitempty"`
	Arch    string         `json:"arch,omitempty"`
	Upgrade *UpgradeStatus `json:"upgrade,omitempty"`
	// Unrecorded are the instances the agent runs that the store has no
	// record of: the store went back in time (a restored backup, a power
	// cut) or lost them. Nothing routes them; they run until stopped.
	Unrecorded []string  `json:"unrecorded,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
}

func (r *MachineState) version() int { return r.Version }

// KeyOK checks that the state is filed under its machine.
func (r *MachineState) KeyOK(key string) error { return keyMust(key, r.Machine) }

// MachineBeat is one machine's agent saying it is alive, and how often it
// says so. Key: the machine ID.
type MachineBeat struct {
	Version  int       `json:"version"`
	Machine  string    `json:"machine"`
	At       time.Time `json:"at"`
	Interval Duration  `json:"interval"`
	// Release is the version of the agent that beats, Generation the
	// schema generation it reads and writes (0 from an agent before
	// announcements: see GenerationOf).
	Release    string `json:"release,omitempty"`
	Generation int    `json:"generation,omitempty"`
}

func (r *MachineBeat) version() int { return r.Version }

// KeyOK checks that the beat is filed under its machine.
func (r *MachineBeat) KeyOK(key string) error { return keyMust(key, r.Machine) }

// DefaultBeatInterval is how often an agent beats unless told otherwise.
const DefaultBeatInterval = 10 * time.Second

// Machine liveness, computed when read from the last beat and the interval
// it announced (the same missed-beat thresholds as the mesh's).
const (
	MachineFresh = "fresh"
	// MachineStale: MeshUnreachableAfter beats or more missed.
	MachineStale = "stale"
	// MachineOffline: MeshOfflineAfter beats or more missed.
	MachineOffline = "offline"
	// MachineNeverSeen: no beat (an agent older than beats, or one that
	// never ran).
	MachineNeverSeen = "never"
)

// Liveness judges the beat at now; a nil beat was never seen.
func (r *MachineBeat) Liveness(now time.Time) string {
	if r == nil || r.At.IsZero() {
		return MachineNeverSeen
	}
	iv := time.Duration(r.Interval)
	if iv <= 0 {
		iv = DefaultBeatInterval
	}
	switch age := now.Sub(r.At); {
	case age >= MeshOfflineAfter*iv:
		return MachineOffline
	case age >= MeshUnreachableAfter*iv:
		return MachineStale
	default:
		return MachineFresh
	}
}

// MachineBeatFromMsg reads a beat as the heartbeats bucket stored it (read
// by a scan or republished): it is taken only under the key its subject
// names.
func (s *Store) MachineBeatFromMsg(sm *StoredMsg) (*MachineBeat, error) {
	bucket := s.Names.MachineBeatsBucket()
	key, ok := strings.CutPrefix(sm.Subject, "$KV."+bucket+".")
	if !ok {
		return nil, fmt.Errorf("%s: not a heartbeat subject", sm.Subject)
	}
	var b MachineBeat
	if err := DecodeKeyed(bucket, key, sm.Data, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// PutMachineBeat records that machine's agent is alive now and beats every
// interval.
func (s *Store) PutMachineBeat(ctx context.Context, machine string, interval time.Duration) error {
	release, gen := Announcement()
	_, err := PutJSON(ctx, s.machineBeats, machine, &MachineBeat{Version: RecordVersion, Machine: machine, At: time.Now().UTC(), Interval: Duration(interval),
		Release: release, Generation: gen})
	if err != nil {
		return fmt.Errorf("heartbeat of %s: %w", machine, err)
	}
	return nil
}

// PutMachineState records what machine's agent runs.
func (s *Store) PutMachineState(ctx context.Context, st *MachineState) error {
	st.Version, st.UpdatedAt = RecordVersion, time.Now().UTC()
	if _, err := PutJSON(ctx, s.machineStates, st.Machine, st); err != nil {
		return fmt.Errorf("state of machine %s: %w", st.Machine, err)
	}
	return nil
}

// MachineObservations reads every machine's state and last beat.
func (s *Store) MachineObservations(ctx context.Context) (states map[string]MachineState, beats map[string]MachineBeat, err error) {
	states, beats = map[string]MachineState{}, map[string]MachineBeat{}
	if err := ListJSON(ctx, s, s.machineStates, ">", func(_ string, r *MachineState) error {
		states[r.Machine] = *r
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if err := ListJSON(ctx, s, s.machineBeats, ">", func(_ string, r *MachineBeat) error {
		beats[r.Machine] = *r
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return states, beats, nil
}
