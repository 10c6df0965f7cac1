package projection

import (
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// builder derives a new View from a base View by applying events. Each
// shard is copied before its first change in this builder, so the base stays
// untouched and every shard not touched is shared.
//
// A service's endpoints are admitted (store.CheckEndpoint) against the
// machines as the builder ends with them, in finish: the services upserted
// here, and those with an endpoint on a machine that came, went or moved.
// So a service and its machine may come in either order, and an endpoint
// is dialled only at the address its machine holds now.
type builder struct {
	v                                   View
	ownSvc, ownExact, ownWild, ownMachs [nShards]bool
	ownAside, ownMachRegions, ownL4     bool
	changed                             bool
	// unadmitted are the services upserted here, whose endpoints finish
	// admits; moved the known machines whose address changed here (or
	// that went), joined those new to the view.
	unadmitted    map[string]*Service
	moved, joined map[string]bool
	// refused are the endpoints finish left out, with why.
	refused []error
}

func newBuilder(base *View) *builder {
	b := &builder{v: *base}
	b.v.lists = nil
	return b
}

func cowShard[V any](s *shards[V], own *[nShards]bool, key string) map[string]V {
	i := shardOf(key)
	if !own[i] {
		// Clone copies the table as it is, without hashing every key
		// again: a batch that touches every shard costs a copy of the
		// index, not its rebuild.
		m := maps.Clone(s[i])
		if m == nil {
			m = map[string]V{}
		}
		s[i] = m
		own[i] = true
	}
	return s[i]
}

// apply applies one routing event. It fails only for an event it cannot
// understand; the view is then unchanged for that event.
func (b *builder) apply(ev *store.RoutingEvent) error {
	switch ev.Kind {
	case store.EventServiceUpsert:
		if ev.Namespace == "" || ev.Service == "" {
			return fmt.Errorf("service upsert without namespace or service")
		}
		b.upsertService(ev)
	case store.EventServiceRemove:
		if ev.Namespace == "" || ev.Service == "" {
			return fmt.Errorf("service removal without namespace or service")
		}
		b.removeService(ev.Namespace + "/" + ev.Service)
	case store.EventMachineUpsert:
		if ev.Machine == nil || ev.Machine.ID == "" {
			return fmt.Errorf("machine upsert without a machine")
		}
		b.upsertMachine(*ev.Machine)
	case store.EventMachineRemove:
		if ev.Machine == nil || ev.Machine.ID == "" {
			return fmt.Errorf("machine removal without a machine")
		}
		b.removeMachine(ev.Machine.ID)
	case store.EventRegionUpsert:
		if ev.Region == nil || ev.Region.Name == "" {
			return fmt.Errorf("region upsert without a region")
		}
		b.upsertRegion(*ev.Region)
	case store.EventMaintenanceUpsert:
		if ev.Maintenance == nil || ev.Maintenance.Namespace == "" {
			return fmt.Errorf("maintenance upsert without a namespace")
		}
		b.upsertMaintenance(*ev.Maintenance)
	default:
		return fmt.Errorf("unknown routing event kind %q", ev.Kind)
	}
	return nil
}

func (b *builder) upsertService(ev *store.RoutingEvent) {
	s := &Service{
		Namespace: ev.Namespace, Name: ev.Service, DeployID: ev.DeployID, Revision: ev.Revision,
		Routes: ev.Routes, signed: ev.Endpoints, HealthPath: ev.HealthPath, Split: ev.Split,
		Locality: ev.Locality, SlowStart: time.Duration(ev.SlowStart), Layer4: ev.Layer4,
	}
	key := s.Key()
	b.removeService(key)
	if !s.Layer4.Empty() {
		b.markLayer4(key, true)
	}
	cowShard(&b.v.services, &b.ownSvc, key)[key] = s
	b.v.numServices++
	if b.unadmitted == nil {
		b.unadmitted = map[string]*Service{}
	}
	b.unadmitted[key] = s
	for _, hp := range routeEntries(s) {
		if hp.wild {
			b.addHost(&b.v.wild, &b.ownWild, hp.host, hostRoute{Prefix: hp.prefix, Route: hp.route, Service: s})
		} else {
			b.addHost(&b.v.exact, &b.ownExact, hp.host, hostRoute{Prefix: hp.prefix, Route: hp.route, Service: s})
		}
	}
	b.changed = true
}

func (b *builder) removeService(key string) {
	old, ok := b.v.services.get(key)
	if !ok {
		return
	}
	delete(cowShard(&b.v.services, &b.ownSvc, key), key)
	b.v.numServices--
	if _, counted := b.unadmitted[key]; counted {
		// Upserted here: its endpoints are not counted yet.
		delete(b.unadmitted, key)
	} else {
		b.v.numEndpoints -= len(old.Endpoints)
		b.v.numSetAside -= len(old.signed) - len(old.Endpoints)
	}
	b.setAside(key, false)
	if !old.Layer4.Empty() {
		b.markLayer4(key, false)
	}
	for _, hp := range routeEntries(old) {
		if hp.wild {
			b.dropHost(&b.v.wild, &b.ownWild, hp.host, old)
		} else {
			b.dropHost(&b.v.exact, &b.ownExact, hp.host, old)
		}
	}
	b.changed = true
}

func (b *builder) addHost(idx *shards[[]hostRoute], own *[nShards]bool, host string, r hostRoute) {
	m := cowShard(idx, own, host)
	old := m[host]
	rs := make([]hostRoute, 0, len(old)+1)
	for _, o := range old {
		// One service names a (host, prefix) once; a repeat is a no-op.
		if o.Service == r.Service && o.Prefix == r.Prefix {
			return
		}
	}
	rs = append(rs, old...)
	rs = append(rs, r)
	// A host belongs to one namespace. The store refuses a second owner,
	// but a view built from records written around that check (or before
	// it existed) may hold two: the lowest namespace is served, on every
	// gateway alike, and the view reports the conflict. Within the owner,
	// longest prefix first; between services claiming the same prefix the
	// lowest name wins.
	sort.SliceStable(rs, func(i, j int) bool {
		if rs[i].Service.Namespace != rs[j].Service.Namespace {
			return rs[i].Service.Namespace < rs[j].Service.Namespace
		}
		if len(rs[i].Prefix) != len(rs[j].Prefix) {
			return len(rs[i].Prefix) > len(rs[j].Prefix)
		}
		if rs[i].Prefix != rs[j].Prefix {
			return rs[i].Prefix < rs[j].Prefix
		}
		return rs[i].Service.Key() < rs[j].Service.Key()
	})
	m[host] = rs
}

// dropHost removes svc's routes for host. Route entries point at the very
// *Service the services index holds, so identity decides.
func (b *builder) dropHost(idx *shards[[]hostRoute], own *[nShards]bool, host string, svc *Service) {
	cur, ok := idx.get(host)
	if !ok {
		return
	}
	m := cowShard(idx, own, host)
	rs := make([]hostRoute, 0, len(cur))
	for _, r := range cur {
		if r.Service != svc {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		delete(m, host)
	} else {
		m[host] = rs
	}
}

func (b *builder) upsertMachine(m store.MachineRecord) {
	old, ok := b.v.machines.get(m.ID)
	switch {
	case !ok:
		b.v.numMachines++
		b.joined = addTo(b.joined, m.ID)
	case old.Address != m.Address:
		b.moved = addTo(b.moved, m.ID)
	}
	if !ok || old.Region != m.Region {
		if ok {
			b.countRegion(old.Region, -1)
		}
		b.countRegion(m.Region, 1)
	}
	cowShard(&b.v.machines, &b.ownMachs, m.ID)[m.ID] = m
	b.changed = true
}

// upsertRegion sets a region's state. Regions are few: the map is
// copied on every change, never changed in place once in a view.
func (b *builder) upsertRegion(r store.RegionRecord) {
	if old, ok := b.v.regions[r.Name]; ok && old == r {
		return
	}
	b.v.regions = maps.Clone(b.v.regions)
	if b.v.regions == nil {
		b.v.regions = map[string]store.RegionRecord{}
	}
	b.v.regions[r.Name] = r
	b.changed = true
}

// countRegion adds n to the machines counted in region: a copy of the
// counts on the first change in this builder, as they are shared with
// the base view.
func (b *builder) countRegion(region string, n int) {
	if region == "" {
		return
	}
	if !b.ownMachRegions {
		b.v.machineRegions, b.ownMachRegions = maps.Clone(b.v.machineRegions), true
		if b.v.machineRegions == nil {
			b.v.machineRegions = map[string]int{}
		}
	}
	if b.v.machineRegions[region] += n; b.v.machineRegions[region] <= 0 {
		delete(b.v.machineRegions, region)
	}
}

func (b *builder) removeMachine(id string) {
	old, ok := b.v.machines.get(id)
	if !ok {
		return
	}
	b.countRegion(old.Region, -1)
	delete(cowShard(&b.v.machines, &b.ownMachs, id), id)
	b.v.numMachines--
	b.moved = addTo(b.moved, id)
	b.changed = true
}

func addTo(set map[string]bool, key string) map[string]bool {
	if set == nil {
		set = map[string]bool{}
	}
	set[key] = true
	return set
}

// setAside notes whether service key has endpoints set aside: the
// services a machine that joins may let in.
func (b *builder) setAside(key string, on bool) {
	if b.v.aside[key] == on {
		return
	}
	if !b.ownAside {
		b.v.aside, b.ownAside = maps.Clone(b.v.aside), true
		if b.v.aside == nil {
			b.v.aside = map[string]bool{}
		}
	}
	if on {
		b.v.aside[key] = true
	} else {
		delete(b.v.aside, key)
	}
}

// admit settles the endpoints of every service whose endpoints may have
// changed in this builder: each endpoint of the signed event is dialled
// only if its machine's record admits it (store.CheckEndpoint); the others
// are set aside, and each refusal is kept in b.refused.
func (b *builder) admit() {
	// A machine that came, went or moved changes what its services'
	// endpoints may be: they are derived again (a Service is immutable,
	// so as a new one). One that moved or went may take endpoints out of
	// any service; one that joined only lets in endpoints set aside.
	onChanged := func(s *Service) bool {
		if _, ok := b.unadmitted[s.Key()]; ok {
			return false
		}
		for _, e := range s.signed {
			if b.moved[e.Machine] || b.joined[e.Machine] {
				return true
			}
		}
		return false
	}
	var again []*Service
	switch {
	case len(b.moved) > 0:
		for _, m := range b.v.services {
			for _, s := range m {
				if onChanged(s) {
					again = append(again, s)
				}
			}
		}
	case len(b.joined) > 0:
		for key := range b.v.aside {
			if s, ok := b.v.services.get(key); ok && onChanged(s) {
				again = append(again, s)
			}
		}
	}
	for _, s := range again {
		b.upsertService(s.event())
	}
	for _, s := range b.unadmitted {
		// Most services have every endpoint admitted: they share the
		// event's slice, and only one with a refusal gets its own.
		var kept []store.Endpoint
		for i := range s.signed {
			e := &s.signed[i]
			m, known := b.v.machines.get(e.Machine)
			var mp *store.MachineRecord
			if known {
				mp = &m
			}
			if err := store.CheckEndpoint(e, mp); err != nil {
				if kept == nil {
					kept = append(make([]store.Endpoint, 0, len(s.signed)-1), s.signed[:i]...)
				}
				b.refused = append(b.refused, fmt.Errorf("%s: %w", s.Key(), err))
				continue
			}
			if kept != nil {
				kept = append(kept, *e)
			}
		}
		s.Endpoints = s.signed
		if kept != nil {
			s.Endpoints = kept
		}
		b.v.numEndpoints += len(s.Endpoints)
		b.v.numSetAside += len(s.signed) - len(s.Endpoints)
		b.setAside(s.Key(), len(s.Endpoints) != len(s.signed))
	}
	b.unadmitted, b.moved, b.joined = nil, nil, nil
}

// FromState builds the view of a stored routing state exactly as a
// gateway's load builds it (without the last good state a gateway keeps
// for what does not verify): what every gateway should serve at rs.Seq.
// control doctor compares gateways' digests with it. Events it cannot use
// are returned as errors beside the view.
func FromState(rs *store.RoutingState) (*View, []error) {
	b := newBuilder(emptyView(false))
	var errs []error
	for i := range rs.Services {
		if err := b.apply(&rs.Services[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rs.Services[i].Identity(), err))
		}
	}
	for _, m := range rs.Machines {
		b.upsertMachine(m)
	}
	for _, r := range rs.Regions {
		b.upsertRegion(r)
	}
	for _, m := range rs.Maintenance {
		b.upsertMaintenance(m)
	}
	v := b.finish(rs.Seq, false)
	return v, append(errs, b.refused...)
}

// finish returns the new immutable View at seq, its endpoints admitted
// (b.refused says which were not).
func (b *builder) finish(seq uint64, stale bool) *View {
	b.admit()
	v := b.v
	v.Seq = seq
	v.Stale = stale
	if b.changed {
		v.BuiltAt = time.Now()
	}
	v.lists = new(lazyLists)
	return &v
}

type hostPrefix struct {
	host   string // normalised; for a wildcard, the suffix with its dot
	wild   bool
	prefix string
	route  int // index into the service's Routes
}

// routeEntries expands a service's routes into (host, prefix) pairs under
// normalised names. Unusable hosts are skipped: a route cannot make the
// gateway serve something nobody can ask for.
func routeEntries(s *Service) []hostPrefix {
	var out []hostPrefix
	for i, r := range s.Routes {
		prefixes := r.PathPrefixes
		if len(prefixes) == 0 {
			prefixes = []string{"/"}
		}
		for _, h := range r.Hosts {
			var hp hostPrefix
			if strings.HasPrefix(h, "*.") {
				n, ok := normalizeHost(h[2:])
				if !ok {
					continue
				}
				hp = hostPrefix{host: "." + n, wild: true, route: i}
			} else {
				n, ok := normalizeRequestHost(h)
				if !ok || strings.Contains(n, "*") {
					continue
				}
				hp = hostPrefix{host: n, route: i}
			}
			for _, p := range prefixes {
				if p == "" {
					p = "/"
				}
				if p[0] != '/' {
					p = "/" + p
				}
				hp.prefix = p
				out = append(out, hp)
			}
		}
	}
	return out
}
