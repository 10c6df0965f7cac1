package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Machine liveness, judged once for the fleet. Every gateway needs to know
// when a machine stops beating, to set its instances aside; if every
// gateway followed every beat, a storage node would send each beat once
// per gateway (10,000 machines beating every 10 s to 100 gateways: 100,000
// messages a second, which delayed a routing event queued behind them by
// hundreds of milliseconds). So the control server's aggregator, which
// follows the beats anyway, judges them, and writes one record listing
// the machines that stopped beating: when that list changes, and every
// LivenessRefresh so that a reader knows the judge is there.

// LivenessKey is the one key of the machine liveness bucket.
const LivenessKey = "down"

// LivenessRefresh is how often the judgement is written when nothing
// changed. A reader takes a record older than LivenessExpiry as no
// judgement at all: with the judge away, no machine is set aside on its
// word (the gateway's own health checks still are).
const (
	LivenessRefresh = 5 * time.Second
	LivenessExpiry  = 3 * LivenessRefresh
)

// LivenessRecord is the judgement: the machines that missed
// MeshUnreachableAfter beats or more when it was made.
type LivenessRecord struct {
	Version int `json:"version"`
	// At is when the judgement was made, by the judge's clock; Judge is
	// who made it.
	At    time.Time `json:"at"`
	Judge string    `json:"judge,omitempty"`
	// Down holds, by machine, how it was judged.
	Down map[string]MachineDown `json:"down,omitempty"`
}

func (r *LivenessRecord) version() int { return r.Version }

// MachineDown is why a machine's instances are set aside.
type MachineDown struct {
	// Liveness is MachineStale or MachineOffline.
	Liveness string `json:"liveness"`
	// LastBeat is when the judge last heard the machine beat (by its own
	// clock, or the store's for a beat read at its start).
	LastBeat time.Time `json:"last_beat"`
	// Interval is the beat interval the machine announced.
	Interval time.Duration `json:"interval"`
}

// Fresh says whether r is a judgement a reader may act on at now.
func (r *LivenessRecord) Fresh(now time.Time) bool {
	return r != nil && now.Sub(r.At) < LivenessExpiry
}

// PutLiveness writes the fleet's liveness judgement (control role only).
func (s *Store) PutLiveness(ctx context.Context, r *LivenessRecord) error {
	r.Version = RecordVersion
	if _, err := PutJSON(ctx, s.machineLiveness, LivenessKey, r); err != nil {
		return fmt.Errorf("writing machine liveness: %w", err)
	}
	return nil
}

// Liveness reads the fleet's liveness judgement; nil when none was made.
func (s *Store) Liveness(ctx context.Context) (*LivenessRecord, error) {
	var r LivenessRecord
	if _, err := GetJSON(ctx, s.machineLiveness, LivenessKey, &r); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading machine liveness: %w", err)
	}
	return &r, nil
}

// LivenessFromMsg reads a judgement as the liveness bucket republished it.
func (s *Store) LivenessFromMsg(sm *StoredMsg) (*LivenessRecord, error) {
	key, ok := strings.CutPrefix(sm.Subject, "$KV."+s.Names.MachineLivenessBucket()+".")
	if !ok || key != LivenessKey {
		return nil, fmt.Errorf("%s: not the machine liveness record", sm.Subject)
	}
	var r LivenessRecord
	if err := Decode("machine liveness", sm.Data, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
