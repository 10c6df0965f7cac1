package doctor

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/store"
)

// checkPorts compares the gateway ports each live commit exposes with
// their claims, as checkHosts does hosts (in the hosts layer: ports are
// owned beside hosts): every exposed port owned by its namespace, nothing
// owned that nobody exposes.
func (d *doctor) checkPorts(ctx context.Context) error {
	exposedBy := map[store.PortKey][]string{}
	for _, ns := range slices.Sorted(maps.Keys(d.live)) {
		for _, p := range hosts.PortsOfManifest(&d.live[ns].Manifest) {
			exposedBy[p.Key] = append(exposedBy[p.Key], ns+"/"+p.Service)
		}
	}
	owner := map[store.PortKey]store.PortClaim{}
	if err := d.s.ListPortClaims(ctx, func(c *store.PortClaim) error {
		owner[c.Key()] = *c
		return nil
	}); err != nil {
		return err
	}
	nsOf := func(svc string) string { ns, _, _ := strings.Cut(svc, "/"); return ns }
	for _, k := range slices.SortedFunc(maps.Keys(exposedBy), store.PortKey.Compare) {
		by := exposedBy[k]
		c, ok := owner[k]
		// Two services exposing one port are said once, from the view
		// the gateways serve (checkLayer4); here only the claim.
		switch {
		case !ok:
			d.add(LayerHosts, Problem, k.String(), "exposed by %s but owned by nobody: another namespace could claim it (restart `control server` to claim it)", by[0])
		case c.Namespace != nsOf(by[0]):
			d.add(LayerHosts, Problem, k.String(), "exposed by %s but owned by %s", by[0], c.Namespace)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(owner), store.PortKey.Compare) {
		c := owner[k]
		// One exposed by another namespace is said above, once.
		if len(exposedBy[k]) > 0 || d.leaseHolder(ctx, c.Namespace) != "" {
			continue
		}
		d.add(LayerHosts, Problem, k.String(), "owned by %s (service %s), which no longer exposes it: nobody else can expose it until released", c.Namespace, c.Service)
	}
	d.checked(LayerHosts, len(owner))
	return nil
}
