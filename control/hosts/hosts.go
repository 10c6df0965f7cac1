// Package hosts decides which namespace owns a hostname. A host belongs to
// one namespace: the first to route it, until that namespace stops routing
// it. A wildcard "*.example.com" covers every name under example.com, so it
// conflicts with any of them owned elsewhere, and they with it. Claims live
// in the store's hosts bucket (store.HostClaim); every claim and release
// runs under one lease (store.HostsLockKey), so two namespaces racing for a
// host cannot both win. Hosts are normalised by the manifest (case,
// trailing dot, IDNA) before they get here. A tls_passthrough host is a
// host as a route's is: owned the same way, so it conflicts with another
// namespace's HTTP hosts and they with it. Gateway ports (tcp/N, udp/N)
// are owned the same way too (ports.go), claimed and released with the
// hosts in one Claim, Release or KeepOnly.
package hosts

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// OfManifest lists the hosts m routes or passes TLS through for, sorted,
// each once.
func OfManifest(m *store.Manifest) []string {
	seen := map[string]bool{}
	var out []string
	use := func(h string) {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, svc := range m.Services {
		for _, r := range svc.Routes {
			for _, h := range r.Hosts {
				use(h)
			}
		}
		for _, h := range svc.PassthroughHosts() {
			use(h)
		}
	}
	sort.Strings(out)
	return out
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

// Check refuses, with host_owned, w's hosts of which any is owned by
// another namespace than ns, itself or through a covering wildcard, or
// (for a wildcard) has a name under it owned elsewhere; then, with
// port_owned, its ports of which any another namespace owns. It writes
// nothing.
func Check(ctx context.Context, s *store.Store, ns string, w Wanted) error {
	if err := checkHosts(ctx, s, ns, w.Hosts); err != nil {
		return err
	}
	return checkPorts(ctx, s, ns, w.Ports)
}

func checkHosts(ctx context.Context, s *store.Store, ns string, hosts []string) error {
	var keys, prefixes []string
	for _, h := range hosts {
		keys = append(keys, store.HostKey(h))
		for _, w := range coveringWildcards(h) {
			keys = append(keys, store.HostKey(w))
		}
		if strings.HasPrefix(h, "*.") {
			prefixes = append(prefixes, store.HostKey(h[2:]))
		}
	}
	claims, err := s.HostClaims(ctx, keys, prefixes)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		var conflicts []store.HostClaim
		check := func(k string) {
			if c, ok := claims[k]; ok && c.Namespace != ns {
				conflicts = append(conflicts, c)
			}
		}
		check(store.HostKey(h))
		for _, w := range coveringWildcards(h) {
			check(store.HostKey(w))
		}
		if strings.HasPrefix(h, "*.") {
			under := store.HostKey(h[2:]) + "."
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
			return store.Errorf(store.CodeHostOwned, "host %s belongs to namespace %s, which %s; namespace %s may not route it", h, c.Namespace, how, ns).
				With("host", h).With("owner", c.Namespace).With("owned_host", c.Host).With("requester", ns)
		}
	}
	return nil
}

// Claim makes ns the owner of w's hosts and ports, after Check under the
// hosts lease. It returns those ns did not own before (what an aborted
// apply gives back with Release), also when it fails part way.
func Claim(ctx context.Context, s *store.Store, ns, deployID string, w Wanted) (Wanted, error) {
	var claimed Wanted
	lease, err := acquire(ctx, s)
	if err != nil {
		return claimed, err
	}
	defer releaseSoon(lease)
	if err := Check(ctx, s, ns, w); err != nil {
		return claimed, err
	}
	cur, err := s.HostClaims(ctx, keysOf(w.Hosts), nil)
	if err != nil {
		return claimed, err
	}
	for _, h := range w.Hosts {
		if c, ok := cur[store.HostKey(h)]; ok && c.Namespace == ns {
			continue
		}
		if err := lease.Check(ctx); err != nil {
			return claimed, err
		}
		if err := s.PutHostClaim(ctx, &store.HostClaim{Host: h, Namespace: ns, DeployID: deployID, Since: time.Now().UTC()}); err != nil {
			return claimed, err
		}
		claimed.Hosts = append(claimed.Hosts, h)
	}
	claimed.Ports, err = claimPorts(ctx, s, lease, ns, w.Ports)
	return claimed, err
}

// Release gives up ns's claims on w's hosts and ports (a claim another
// namespace holds is left alone).
func Release(ctx context.Context, s *store.Store, ns string, w Wanted) error {
	if w.Empty() {
		return nil
	}
	lease, err := acquire(ctx, s)
	if err != nil {
		return err
	}
	defer releaseSoon(lease)
	if err := releasePorts(ctx, s, lease, ns, w.Ports); err != nil {
		return err
	}
	hosts := w.Hosts
	cur, err := s.HostClaims(ctx, keysOf(hosts), nil)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if c, ok := cur[store.HostKey(h)]; !ok || c.Namespace != ns {
			continue
		}
		if err := lease.Check(ctx); err != nil {
			return err
		}
		if err := s.DeleteHostClaim(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// Owned lists the hosts ns owns, sorted.
func Owned(ctx context.Context, s *store.Store, ns string) ([]string, error) {
	var out []string
	err := s.ListHostClaims(ctx, func(c *store.HostClaim) error {
		if c.Namespace == ns {
			out = append(out, c.Host)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// KeepOnly releases ns's claims on every host and port not in keep: what
// a namespace no longer routes or exposes after its live commit is served.
func KeepOnly(ctx context.Context, s *store.Store, ns string, keep Wanted) error {
	owned, err := Owned(ctx, s, ns)
	if err != nil {
		return err
	}
	ports, err := OwnedPorts(ctx, s, ns)
	if err != nil {
		return err
	}
	var drop Wanted
	for _, h := range owned {
		if !slices.Contains(keep.Hosts, h) {
			drop.Hosts = append(drop.Hosts, h)
		}
	}
	kept := portKeys(keep.Ports)
	for _, p := range ports {
		if !slices.Contains(kept, p.Key) {
			drop.Ports = append(drop.Ports, p)
		}
	}
	return Release(ctx, s, ns, drop)
}

// Backfill claims, for every namespace's live commit, the hosts it routes
// and the ports it exposes that nobody owns yet: a store written before
// ownership existed. A host or port two live commits want goes to the
// namespace that sorts first; the conflicts are returned, one line each.
func Backfill(ctx context.Context, s *store.Store) ([]string, error) {
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
		w := Of(&c.Manifest)
		if _, err := Claim(ctx, s, ns, c.ID, w); err != nil {
			if !store.HasCode(err, store.CodeHostOwned) && !store.HasCode(err, store.CodePortOwned) {
				return conflicts, err
			}
			// Claim what it can, one by one, naming each conflict.
			try := func(one Wanted) error {
				_, err := Claim(ctx, s, ns, c.ID, one)
				if store.HasCode(err, store.CodeHostOwned) || store.HasCode(err, store.CodePortOwned) {
					conflicts = append(conflicts, err.Error())
					return nil
				}
				return err
			}
			for _, h := range w.Hosts {
				if err := try(Wanted{Hosts: []string{h}}); err != nil {
					return conflicts, err
				}
			}
			for _, p := range w.Ports {
				if err := try(Wanted{Ports: []Port{p}}); err != nil {
					return conflicts, err
				}
			}
		}
	}
	return conflicts, nil
}

func keysOf(hosts []string) []string {
	keys := make([]string, len(hosts))
	for i, h := range hosts {
		keys[i] = store.HostKey(h)
	}
	return keys
}

// acquire takes the hosts lease, waiting a bounded time for another claim
// in progress (claims take milliseconds).
func acquire(ctx context.Context, s *store.Store) (*store.Lease, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := s.AcquireLease(ctx, store.HostsLockKey, store.LeaseOptions{TTL: 10 * time.Second, Holder: store.DefaultHolder(), Purpose: "host claims"})
		if err == nil || !store.HasCode(err, store.CodeBusy) || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, store.Classify(fmt.Errorf("waiting for %s: %w", store.HostsLockKey, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func releaseSoon(l *store.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Release(ctx)
}
