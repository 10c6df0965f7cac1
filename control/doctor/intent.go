package doctor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// checkDeploys finds deploys nobody finished: not settled, with no
// orchestrator holding the namespace lease.
func (d *doctor) checkDeploys(ctx context.Context) error {
	n := 0
	err := d.s.ListDeployStatus(ctx, ">", func(st *store.DeployStatus) error {
		n++
		if st.Settled && len(st.Cleanup) == 0 {
			return nil
		}
		subj := st.Namespace + " deploy " + st.DeployID
		if holder := d.leaseHolder(ctx, st.Namespace); holder != "" && !st.Settled {
			d.add(LayerDeploys, Note, subj, "in progress: %s at %s, lease held by %s", st.State, st.Phase, holder)
			return nil
		}
		if len(st.Cleanup) > 0 {
			var what []string
			for _, c := range st.Cleanup {
				what = append(what, fmt.Sprintf("%s on %s", c.InstanceID, c.Machine))
			}
			d.add(LayerDeploys, Problem, subj, "%d instances it could not stop: %s (`control server` retries while their machines answer)",
				len(st.Cleanup), strings.Join(what, ", "))
			return nil
		}
		d.add(LayerDeploys, Problem, subj, "%s at %s and not settled, with no orchestrator holding the lease (`control server` finishes it)", st.State, st.Phase)
		return nil
	})
	d.checked(LayerDeploys, n)
	return err
}

// leaseHolder is who holds ns's deploy lease now, "" if nobody.
func (d *doctor) leaseHolder(ctx context.Context, ns string) string {
	d.mu.Lock()
	h, ok := d.inflight[ns]
	d.mu.Unlock()
	if ok {
		return h
	}
	if lh, err := d.s.LockHolder(ctx, store.DeployLockKey(ns)); err == nil && d.now.Before(lh.Expires) {
		h = lh.Holder
	}
	d.mu.Lock()
	d.inflight[ns] = h
	d.mu.Unlock()
	return h
}

// checkInstances compares each live commit's slots with the instance
// records: a slot without a ready record, a record no commit routes.
func (d *doctor) checkInstances(ctx context.Context) error {
	inSlot := map[string]bool{}
	for _, ns := range slices.Sorted(maps.Keys(d.live)) {
		c := d.live[ns]
		for _, sl := range c.Slots {
			inSlot[sl.InstanceID] = true
			subj := fmt.Sprintf("%s/%s slot %d", ns, sl.Service, sl.Slot)
			rec := d.insts[sl.InstanceID]
			switch {
			case rec == nil:
				d.add(LayerInstances, Problem, subj, "instance %s on %s has no record: nothing serves this slot (the next apply of %s replaces it)", sl.InstanceID, sl.Machine, ns)
			case !routing.Routable(rec, sl):
				msg := fmt.Sprintf("instance %s on %s is %s", rec.ID, rec.Machine, rec.State)
				if rec.Error != "" {
					msg += ": " + rec.Error
				}
				d.add(LayerInstances, Problem, subj, "%s; it is out of the routing", msg)
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.insts)) {
		rec := d.insts[id]
		if inSlot[id] {
			continue
		}
		if d.leaseHolder(ctx, rec.Namespace) != "" {
			continue // a candidate of the deploy in progress
		}
		d.add(LayerInstances, Problem, rec.Namespace+"/"+rec.Service,
			"record %s on %s (deploy %s, %s) belongs to no live commit: a leftover (`control server` stops it once the machine answers)",
			rec.ID, rec.Machine, rec.DeployID, rec.State)
	}
	d.checked(LayerInstances, len(d.insts))
	return nil
}

// checkLeases finds leases that outlived their holder: expired but still
// stored, or held by a process of this host that no longer runs.
func (d *doctor) checkLeases(ctx context.Context) error {
	n := 0
	host := store.HostName("localhost")
	err := d.s.ListLockHolders(ctx, func(key string, h *store.LeaseHolder) error {
		n++
		// The store drops an expired key within about a second.
		if d.now.Sub(h.Expires) > 2*time.Second {
			d.add(LayerLeases, Problem, key, "expired at %s but still stored (holder %s)", h.Expires.UTC().Format("15:04:05"), h.Holder)
			return nil
		}
		hostPart, pidPart, ok := strings.Cut(h.Holder, ":")
		pid, err := strconv.Atoi(pidPart)
		if !ok || err != nil || hostPart != host || pid <= 0 {
			return nil
		}
		if perr := syscall.Kill(pid, 0); errors.Is(perr, syscall.ESRCH) {
			d.add(LayerLeases, Problem, key, "held by %s (%s), a process of this host that no longer runs; it frees at %s",
				h.Holder, h.Purpose, h.Expires.UTC().Format("15:04:05"))
		}
		return nil
	})
	d.checked(LayerLeases, n)
	return err
}

// checkHosts compares the hosts each live commit routes with their owner
// records: every routed host owned by its namespace, nothing owned that
// nobody routes.
func (d *doctor) checkHosts(ctx context.Context) error {
	routedBy := map[string][]string{}
	for _, ns := range slices.Sorted(maps.Keys(d.live)) {
		for _, h := range hosts.OfManifest(&d.live[ns].Manifest) {
			routedBy[h] = append(routedBy[h], ns)
		}
	}
	for _, h := range slices.Sorted(maps.Keys(routedBy)) {
		nss := routedBy[h]
		c, ok := d.hostOwner[h]
		switch {
		case len(nss) > 1:
			d.add(LayerHosts, Problem, h, "routed by namespaces %s; gateways serve %s only", strings.Join(nss, ", "), nss[0])
		case !ok:
			d.add(LayerHosts, Problem, h, "routed by %s but owned by nobody: another namespace could claim it (restart `control server` to claim it)", nss[0])
		case c.Namespace != nss[0]:
			d.add(LayerHosts, Problem, h, "routed by %s but owned by %s", nss[0], c.Namespace)
		}
	}
	for _, h := range slices.Sorted(maps.Keys(d.hostOwner)) {
		c := d.hostOwner[h]
		if slices.Contains(routedBy[h], c.Namespace) || d.leaseHolder(ctx, c.Namespace) != "" {
			continue
		}
		d.add(LayerHosts, Problem, h, "owned by %s, which no longer routes it: nobody else can route it until released", c.Namespace)
	}
	d.checked(LayerHosts, len(d.hostOwner))
	return nil
}

// checkRouting compares the routing the store derives (what gateways must
// serve) with the live commits and the instance records.
func (d *doctor) checkRouting(ctx context.Context) error {
	want := map[string]bool{}
	for _, ns := range slices.Sorted(maps.Keys(d.live)) {
		c := d.live[ns]
		if d.leaseHolder(ctx, ns) != "" {
			for name := range c.Manifest.Services {
				want[ns+"/"+name] = true
			}
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(c.Manifest.Services)) {
			key := ns + "/" + name
			want[key] = true
			svc, ok := d.view.Service(ns, name)
			if !ok {
				d.add(LayerRouting, Problem, key, "in the live commit %s but not in the routing: its routing events were never published", c.ID)
				continue
			}
			if svc.DeployID != c.ID {
				d.add(LayerRouting, Problem, key, "routing serves deploy %s, the live commit is %s: its routing events were not published", svc.DeployID, c.ID)
				continue
			}
			var routed, ready []string
			for _, ep := range svc.Endpoints {
				routed = append(routed, ep.InstanceID)
			}
			for _, sl := range c.Slots {
				if sl.Service == name && routing.Routable(d.insts[sl.InstanceID], sl) {
					ready = append(ready, sl.InstanceID)
				}
			}
			sort.Strings(routed)
			sort.Strings(ready)
			if !slices.Equal(routed, ready) {
				d.add(LayerRouting, Problem, key, "routing sends traffic to [%s], the ready instances are [%s]",
					strings.Join(routed, " "), strings.Join(ready, " "))
			}
		}
	}
	for _, svc := range d.view.Services() {
		if !want[svc.Key()] {
			d.add(LayerRouting, Problem, svc.Key(), "routed (deploy %s) though no live commit has it", svc.DeployID)
		}
	}
	for _, c := range d.view.Conflicts() {
		d.add(LayerRouting, Problem, c.Host, "routed by namespaces %s and %s; gateways serve %s only", c.Owner, strings.Join(c.Others, ", "), c.Owner)
	}
	// Machines: the routing lists exactly the machine records (DNS names
	// come from it).
	for _, m := range d.view.Machines() {
		rec, ok := d.machines[m.ID]
		switch {
		case !ok:
			d.add(LayerRouting, Problem, "machine "+m.ID, "in the routing (and DNS) but has no machine record")
		case rec.Address != m.Address:
			d.add(LayerRouting, Problem, "machine "+m.ID, "routing says address %s, the record %s", m.Address, rec.Address)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.machines)) {
		if _, ok := d.view.Machine(id); !ok {
			d.add(LayerRouting, Problem, "machine "+id, "has a record but is not in the routing (no DNS name)")
		}
	}
	d.checked(LayerRouting, len(d.view.Services())+len(d.view.Machines()))
	return nil
}
