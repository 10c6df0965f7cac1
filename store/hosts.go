package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Hostname ownership. A host belongs to one namespace: the first to route
// it, until that namespace stops routing it. A wildcard "*.example.com"
// covers every name under example.com, so it conflicts with any of them
// owned elsewhere, and they with it. Claims live in the hosts bucket, keyed
// by HostKey; every claim and release runs under one lease
// (HostsLockKey), so two namespaces racing for a host cannot both win.
// Hosts are normalised by the manifest (case, trailing dot, IDNA) before
// they get here.

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

// coveringWildcards are the wildcard hosts that cover host: for
// "a.b.example.com", "*.b.example.com", "*.example.com" and "*.com" (for a
// wildcard, those above it).
func coveringWildcards(host string) []string {
	labels := strings.Split(strings.TrimPrefix(host, "*."), ".")
	var out []string
	for i := 1; i < len(labels); i++ {
		out = append(out, "*."+strings.Join(labels[i:], "."))
	}
	return out
}

// ManifestHosts lists the hosts m routes, sorted, each once.
func ManifestHosts(m *Manifest) []string {
	seen := map[string]bool{}
	var out []string
	for _, svc := range m.Services {
		for _, r := range svc.Routes {
			for _, h := range r.Hosts {
				if !seen[h] {
					seen[h] = true
					out = append(out, h)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// hostClaims reads the claims of the given keys, and of every key under
// each of prefixes, by key.
func (s *Store) hostClaims(ctx context.Context, keys, prefixes []string) (map[string]HostClaim, error) {
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

// CheckHosts refuses, with host_owned, hosts of which any is owned by
// another namespace than ns, itself or through a covering wildcard, or (for
// a wildcard) has a name under it owned elsewhere. It writes nothing.
func (s *Store) CheckHosts(ctx context.Context, ns string, hosts []string) error {
	var keys, prefixes []string
	for _, h := range hosts {
		keys = append(keys, HostKey(h))
		for _, w := range coveringWildcards(h) {
			keys = append(keys, HostKey(w))
		}
		if strings.HasPrefix(h, "*.") {
			prefixes = append(prefixes, HostKey(h[2:]))
		}
	}
	claims, err := s.hostClaims(ctx, keys, prefixes)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		var conflicts []HostClaim
		check := func(k string) {
			if c, ok := claims[k]; ok && c.Namespace != ns {
				conflicts = append(conflicts, c)
			}
		}
		check(HostKey(h))
		for _, w := range coveringWildcards(h) {
			check(HostKey(w))
		}
		if strings.HasPrefix(h, "*.") {
			under := HostKey(h[2:]) + "."
			for k := range claims {
				if strings.HasPrefix(k, under) {
					check(k)
				}
			}
		}
		if len(conflicts) > 0 {
			sort.Slice(conflicts, func(i, j int) bool { return conflicts[i].Host < conflicts[j].Host })
			c := conflicts[0]
			how := "routes it"
			if c.Host != h {
				how = "routes " + c.Host
			}
			return &Error{Code: CodeHostOwned,
				Message: fmt.Sprintf("host %s belongs to namespace %s, which %s; namespace %s may not route it", h, c.Namespace, how, ns),
				Detail:  map[string]string{"host": h, "owner": c.Namespace, "owned_host": c.Host, "requester": ns}}
		}
	}
	return nil
}

// ClaimHosts makes ns the owner of hosts, after CheckHosts under the hosts
// lease. It returns the hosts ns did not own before (what an aborted
// apply gives back with ReleaseHosts).
func (s *Store) ClaimHosts(ctx context.Context, ns, deployID string, hosts []string) ([]string, error) {
	lease, err := s.hostsLease(ctx)
	if err != nil {
		return nil, err
	}
	defer releaseSoon(lease)
	if err := s.CheckHosts(ctx, ns, hosts); err != nil {
		return nil, err
	}
	keys := make([]string, len(hosts))
	for i, h := range hosts {
		keys[i] = HostKey(h)
	}
	cur, err := s.hostClaims(ctx, keys, nil)
	if err != nil {
		return nil, err
	}
	var claimed []string
	for _, h := range hosts {
		if c, ok := cur[HostKey(h)]; ok && c.Namespace == ns {
			continue
		}
		if err := lease.Check(ctx); err != nil {
			return claimed, err
		}
		rec := HostClaim{Version: RecordVersion, Host: h, Namespace: ns, DeployID: deployID, Since: time.Now().UTC()}
		if _, err := PutJSON(ctx, s.Hosts, HostKey(h), &rec); err != nil {
			return claimed, err
		}
		claimed = append(claimed, h)
	}
	return claimed, nil
}

// ReleaseHosts gives up ns's claims on hosts (a claim another namespace
// holds is left alone).
func (s *Store) ReleaseHosts(ctx context.Context, ns string, hosts []string) error {
	if len(hosts) == 0 {
		return nil
	}
	lease, err := s.hostsLease(ctx)
	if err != nil {
		return err
	}
	defer releaseSoon(lease)
	keys := make([]string, len(hosts))
	for i, h := range hosts {
		keys[i] = HostKey(h)
	}
	cur, err := s.hostClaims(ctx, keys, nil)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if c, ok := cur[HostKey(h)]; !ok || c.Namespace != ns {
			continue
		}
		if err := s.Hosts.Delete(ctx, HostKey(h)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return classify(fmt.Errorf("releasing host %s: %w", h, err))
		}
	}
	return nil
}

// OwnedHosts lists the hosts ns owns, sorted.
func (s *Store) OwnedHosts(ctx context.Context, ns string) ([]string, error) {
	var out []string
	err := ListJSON(ctx, s, s.Hosts, ">", func(_ string, c *HostClaim) error {
		if c.Namespace == ns {
			out = append(out, c.Host)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// KeepOnlyHosts releases ns's claims on every host not in keep: what a
// namespace no longer routes after its live commit is served.
func (s *Store) KeepOnlyHosts(ctx context.Context, ns string, keep []string) error {
	owned, err := s.OwnedHosts(ctx, ns)
	if err != nil {
		return err
	}
	var drop []string
	for _, h := range owned {
		if !slices.Contains(keep, h) {
			drop = append(drop, h)
		}
	}
	return s.ReleaseHosts(ctx, ns, drop)
}

// hostsLease takes the hosts lease, waiting a bounded time for another
// claim in progress (claims take milliseconds).
func (s *Store) hostsLease(ctx context.Context) (*Lease, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := s.AcquireLease(ctx, HostsLockKey, LeaseOptions{TTL: 10 * time.Second, Holder: DefaultHolder(), Purpose: "host claims"})
		if err == nil || !HasCode(err, CodeBusy) || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, classify(fmt.Errorf("waiting for %s: %w", HostsLockKey, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func releaseSoon(l *Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Release(ctx)
}

// BackfillHosts claims, for every namespace's live commit, the hosts it
// routes that nobody owns yet: a store written before ownership existed.
// A host two live commits route goes to the namespace that sorts first;
// the conflicts are returned, one line each.
func (s *Store) BackfillHosts(ctx context.Context) ([]string, error) {
	nss, err := s.CommittedNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	var conflicts []string
	for _, ns := range nss {
		c, err := s.LiveCommit(ctx, ns)
		if err != nil {
			conflicts = append(conflicts, fmt.Sprintf("namespace %s: %v", ns, err))
			continue
		}
		hosts := ManifestHosts(&c.Manifest)
		if _, err := s.ClaimHosts(ctx, ns, c.ID, hosts); err != nil {
			if !HasCode(err, CodeHostOwned) {
				return conflicts, err
			}
			conflicts = append(conflicts, err.Error())
			// Claim what it can, host by host.
			for _, h := range hosts {
				if _, err := s.ClaimHosts(ctx, ns, c.ID, []string{h}); err != nil && !HasCode(err, CodeHostOwned) {
					return conflicts, err
				}
			}
		}
	}
	return conflicts, nil
}
