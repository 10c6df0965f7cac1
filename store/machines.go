package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Machine records are durable intent (membership), written by the control
// role only; these are their reads and writes, each keyed by the record's
// own ID. What may change a record (an invite, an operator's drain) is
// control/machines'.

// GetMachine reads machine id's record and its revision; a machine that is
// not a member is not_found.
func (s *Store) GetMachine(ctx context.Context, id string) (*MachineRecord, uint64, error) {
	var rec MachineRecord
	rev, err := GetJSON(ctx, s.machines, id, &rec)
	if err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, 0, Errorf(CodeNotFound, "unknown machine %s", id).With("machine", id)
		}
		return nil, 0, err
	}
	return &rec, rev, nil
}

// CreateMachine records a new member; a machine already recorded is a
// conflict.
func (s *Store) CreateMachine(ctx context.Context, rec *MachineRecord) error {
	rec.Version = RecordVersion
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.machines.Create(ctx, rec.ID, data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Errorf(CodeConflict, "machine %s is already a member", rec.ID).With("machine", rec.ID)
		}
		return classify(fmt.Errorf("recording machine %s: %w", rec.ID, err))
	}
	return nil
}

// PutMachine writes rec whatever is recorded for its machine: for a fleet
// simulator that records its machines again at every start. Membership
// goes through CreateMachine and UpdateMachine.
func (s *Store) PutMachine(ctx context.Context, rec *MachineRecord) error {
	rec.Version = RecordVersion
	_, err := PutJSON(ctx, s.machines, rec.ID, rec)
	return err
}

// UpdateMachine replaces machine rec.ID's record if it is still at
// revision rev; one changed meanwhile is a conflict.
func (s *Store) UpdateMachine(ctx context.Context, rec *MachineRecord, rev uint64) error {
	rec.Version = RecordVersion
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.machines.Update(ctx, rec.ID, data, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Errorf(CodeConflict, "machine %s changed concurrently; try again", rec.ID).With("machine", rec.ID)
		}
		return classify(fmt.Errorf("updating machine %s: %w", rec.ID, err))
	}
	return nil
}

// DeleteMachine removes machine id's record and the observations its agent
// wrote (state, heartbeat and instance observations), which are noise once it is no member. A
// record already gone is no error.
func (s *Store) DeleteMachine(ctx context.Context, id string) error {
	if err := s.machines.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("removing machine record %s: %w", id, err))
	}
	for _, kv := range []jetstream.KeyValue{s.machineStates, s.machineBeats, s.observed} {
		if err := kv.Delete(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return classify(fmt.Errorf("removing the observations of machine %s: %w", id, err))
		}
	}
	return nil
}

// ListMachines calls fn with every member's record, in key order
// (ListJSON).
func (s *Store) ListMachines(ctx context.Context, fn func(*MachineRecord) error) error {
	return ListJSON(ctx, s, s.machines, ">", func(_ string, m *MachineRecord) error { return fn(m) })
}
