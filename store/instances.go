package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// PutInstance writes rec under the key its body names and returns the new
// revision.
func (s *Store) PutInstance(ctx context.Context, rec *InstanceRecord) (uint64, error) {
	rec.Version = RecordVersion
	return PutJSON(ctx, s.instances, rec.Key(), rec)
}

// GetInstance reads the instance record stored under key (InstanceKey).
func (s *Store) GetInstance(ctx context.Context, key string) (*InstanceRecord, uint64, error) {
	var rec InstanceRecord
	rev, err := GetJSON(ctx, s.instances, key, &rec)
	if err != nil {
		return nil, 0, err
	}
	return &rec, rev, nil
}

// DeleteInstance forgets the instance record under key; a record already
// gone is no error.
func (s *Store) DeleteInstance(ctx context.Context, key string) error {
	if err := s.instances.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("forgetting instance %s: %w", key, err))
	}
	return nil
}
