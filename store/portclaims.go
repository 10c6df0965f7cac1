package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Port claims: which namespace owns a gateway port. They live in the
// hosts bucket beside the host claims (PortClaimKey keeps them apart) and
// are taken and released under HostsLockKey with them; the ownership
// rules are control/hosts'. Here are their reads and writes.

// PortClaims reads the claims of the given ports, by port; a port nobody
// claims is absent.
func (s *Store) PortClaims(ctx context.Context, ports []PortKey) (map[PortKey]PortClaim, error) {
	out := map[PortKey]PortClaim{}
	if len(ports) == 0 {
		return out, nil
	}
	subj := func(k string) string { return "$KV." + s.Names.HostsBucket() + "." + k }
	subjects := make([]string, len(ports))
	for i, k := range ports {
		subjects[i] = subj(PortClaimKey(k))
	}
	err := s.LastOf(ctx, "KV_"+s.Names.HostsBucket(), subjects, func(m *StoredMsg) error {
		key := m.Subject[len(subj("")):]
		if m.Header.Get(kvOperationHeader) != "" {
			return nil
		}
		var c PortClaim
		if err := DecodeKeyed(s.Names.HostsBucket(), key, m.Data, &c); err != nil {
			SkippedRecords.Add(1)
			return nil
		}
		out[c.Key()] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading port claims: %w", err)
	}
	return out, nil
}

// PutPortClaim stores c under its port's key.
func (s *Store) PutPortClaim(ctx context.Context, c *PortClaim) error {
	c.Version = RecordVersion
	_, err := PutJSON(ctx, s.hosts, PortClaimKey(c.Key()), c)
	return err
}

// DeletePortClaim removes k's claim; one already gone is no error.
func (s *Store) DeletePortClaim(ctx context.Context, k PortKey) error {
	if err := s.hosts.Delete(ctx, PortClaimKey(k)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("releasing port %s: %w", k, err))
	}
	return nil
}

// ListPortClaims calls fn with every port claim, in key order.
func (s *Store) ListPortClaims(ctx context.Context, fn func(*PortClaim) error) error {
	return ListJSON(ctx, s, s.hosts, portClaimPrefix+">", func(_ string, c *PortClaim) error { return fn(c) })
}
