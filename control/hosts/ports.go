package hosts

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Gateway ports are owned as hosts are: a namespace's first apply that
// exposes tcp/N or udp/N claims it (store.PortClaim), under the same
// lease and in the same Claim as its hosts, and gives it up when its
// live commit no longer exposes it. The claim names the service, so that
// a refusal can say who holds the port; services of one namespace may
// pass a port between them.

// Port is a gateway port a namespace exposes, with the service that does.
type Port struct {
	Key     store.PortKey
	Service string
}

// Wanted is what a manifest needs to own: the hosts it routes or passes
// through, and the gateway ports it exposes.
type Wanted struct {
	Hosts []string
	Ports []Port
}

// Of lists what m needs to own.
func Of(m *store.Manifest) Wanted { return Wanted{Hosts: OfManifest(m), Ports: PortsOfManifest(m)} }

// Empty says there is nothing to own.
func (w Wanted) Empty() bool { return len(w.Hosts) == 0 && len(w.Ports) == 0 }

// String names the hosts and ports, for messages.
func (w Wanted) String() string {
	names := slices.Clone(w.Hosts)
	for _, p := range w.Ports {
		names = append(names, p.Key.String())
	}
	return strings.Join(names, ", ")
}

// PortsOfManifest lists the gateway ports m exposes, sorted, each once
// (the manifest refuses one port in two services; were it not checked,
// the service first by name would be named).
func PortsOfManifest(m *store.Manifest) []Port {
	seen := map[store.PortKey]bool{}
	var out []Port
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		svc := m.Services[name]
		for _, k := range svc.Ports() {
			if !seen[k] {
				seen[k] = true
				out = append(out, Port{Key: k, Service: name})
			}
		}
	}
	slices.SortFunc(out, func(a, b Port) int { return a.Key.Compare(b.Key) })
	return out
}

func portKeys(ports []Port) []store.PortKey {
	out := make([]store.PortKey, len(ports))
	for i, p := range ports {
		out[i] = p.Key
	}
	return out
}

// checkPorts refuses, with port_owned, ports of which any is owned by
// another namespace than ns. It writes nothing.
func checkPorts(ctx context.Context, s *store.Store, ns string, ports []Port) error {
	claims, err := s.PortClaims(ctx, portKeys(ports))
	if err != nil {
		return err
	}
	for _, p := range ports {
		if c, ok := claims[p.Key]; ok && c.Namespace != ns {
			return store.Errorf(store.CodePortOwned, "port %s belongs to namespace %s (service %s); namespace %s may not expose it",
				p.Key, c.Namespace, c.Service, ns).
				With("port", p.Key.String()).With("owner", c.Namespace).With("owner_service", c.Service).
				With("requester", ns).With("service", p.Service)
		}
	}
	return nil
}

// claimPorts writes ns's claims on ports under lease, after the check;
// it returns the ports ns did not own before.
func claimPorts(ctx context.Context, s *store.Store, lease *store.Lease, ns string, ports []Port) ([]Port, error) {
	cur, err := s.PortClaims(ctx, portKeys(ports))
	if err != nil {
		return nil, err
	}
	var claimed []Port
	for _, p := range ports {
		c, owned := cur[p.Key]
		if owned && c.Namespace == ns && c.Service == p.Service {
			continue
		}
		if err := lease.Check(ctx); err != nil {
			return claimed, err
		}
		if err := s.PutPortClaim(ctx, &store.PortClaim{Proto: p.Key.Proto, Port: p.Key.Port, Namespace: ns, Service: p.Service, At: time.Now().UTC()}); err != nil {
			return claimed, err
		}
		// A port another service of ns held was ns's already: moving it
		// is not a claim an abort gives back.
		if !owned {
			claimed = append(claimed, p)
		}
	}
	return claimed, nil
}

// releasePorts deletes ns's claims on ports under lease; another
// namespace's are left alone.
func releasePorts(ctx context.Context, s *store.Store, lease *store.Lease, ns string, ports []Port) error {
	cur, err := s.PortClaims(ctx, portKeys(ports))
	if err != nil {
		return err
	}
	for _, p := range ports {
		if c, ok := cur[p.Key]; !ok || c.Namespace != ns {
			continue
		}
		if err := lease.Check(ctx); err != nil {
			return err
		}
		if err := s.DeletePortClaim(ctx, p.Key); err != nil {
			return err
		}
	}
	return nil
}

// OwnedPorts lists the ports ns owns, with the service each claim names,
// sorted.
func OwnedPorts(ctx context.Context, s *store.Store, ns string) ([]Port, error) {
	var out []Port
	err := s.ListPortClaims(ctx, func(c *store.PortClaim) error {
		if c.Namespace == ns {
			out = append(out, Port{Key: c.Key(), Service: c.Service})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b Port) int { return a.Key.Compare(b.Key) })
	return out, err
}
