package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Host claims: which namespace owns a host. The ownership rules (the
// first namespace to route a host owns it, wildcards conflict both ways,
// claims are taken under HostsLockKey) are the deploy's, in control/hosts;
// here are the record, its key and its reads and writes.

// CodeHostOwned refuses a manifest that routes a host another namespace
// owns.
const CodeHostOwned = "host_owned"

// HostsLockKey serialises claims and releases of hosts.
const HostsLockKey = "cp.lock.hosts"

// HostClaim says which namespace owns a host. Key: HostKey(Host).
type HostClaim struct {
	Version   int       `json:"version"`
	Host      string    `json:"host"`
	Namespace string    `json:"namespace"`
	DeployID  string    `json:"deploy_id,omitempty"`
	Since     time.Time `json:"since"`
}

func (r *HostClaim) version() int { return r.Version }

// KeyOK checks that the claim is filed under its host.
func (r *HostClaim) KeyOK(key string) error { return keyMust(key, HostKey(r.Host)) }

// hostWildLabel stands for the "*" of a wildcard host in a key: no host
// label can be it.
const hostWildLabel = "_"

// HostKey is a host's key in the hosts bucket: its labels reversed
// ("api.example.com" is "com.example.api", "*.example.com" is
// "com.example._"), so that everything under a name is one key prefix.
func HostKey(host string) string {
	labels := strings.Split(host, ".")
	slices.Reverse(labels)
	for i, l := range labels {
		if l == "*" {
			labels[i] = hostWildLabel
		} else {
			labels[i] = KeySafe(l)
		}
	}
	return strings.Join(labels, ".")
}

// HostClaims reads the claims of the given keys, and of every key under
// each of prefixes (HostKey of a name), by key.
func (s *Store) HostClaims(ctx context.Context, keys, prefixes []string) (map[string]HostClaim, error) {
	out := map[string]HostClaim{}
	subj := func(k string) string { return "$KV." + s.Names.HostsBucket() + "." + k }
	use := func(m *StoredMsg) {
		key := strings.TrimPrefix(m.Subject, subj(""))
		if m.Header.Get(kvOperationHeader) != "" {
			delete(out, key)
			return
		}
		var c HostClaim
		if err := DecodeKeyed(s.Names.HostsBucket(), key, m.Data, &c); err != nil {
			SkippedRecords.Add(1)
			return
		}
		out[key] = c
	}
	if len(keys) > 0 {
		subjects := make([]string, len(keys))
		for i, k := range keys {
			subjects[i] = subj(k)
		}
		if err := s.LastOf(ctx, "KV_"+s.Names.HostsBucket(), subjects, func(m *StoredMsg) error { use(m); return nil }); err != nil {
			return nil, fmt.Errorf("reading host claims: %w", err)
		}
	}
	for _, p := range prefixes {
		if _, err := s.ReadFrom(ctx, "KV_"+s.Names.HostsBucket(), 1, subj(p)+".>", func(m *StoredMsg) error { use(m); return nil }); err != nil {
			return nil, fmt.Errorf("reading host claims: %w", err)
		}
	}
	return out, nil
}

// PutHostClaim stores c under its host's key.
func (s *Store) PutHostClaim(ctx context.Context, c *HostClaim) error {
	c.Version = RecordVersion
	_, err := PutJSON(ctx, s.hosts, HostKey(c.Host), c)
	return err
}

// DeleteHostClaim removes host's claim; one already gone is no error.
func (s *Store) DeleteHostClaim(ctx context.Context, host string) error {
	if err := s.hosts.Delete(ctx, HostKey(host)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return classify(fmt.Errorf("releasing host %s: %w", host, err))
	}
	return nil
}

// ListHostClaims calls fn with every host claim (the port claims filed
// beside them left out).
func (s *Store) ListHostClaims(ctx context.Context, fn func(*HostClaim) error) error {
	return ListJSON(ctx, s, s.hosts, ">", func(_ string, c *HostClaim) error { return fn(c) },
		func(c *listConfig) { c.except = func(k string) bool { return strings.HasPrefix(k, portClaimPrefix) } })
}
