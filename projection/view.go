package projection

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/edgeplane/edgeplane/store"
)

// nShards splits every index of a View so that applying one event copies
// only the shards it touches (about 1/nShards of the index) instead of the
// whole map: views stay immutable and cheap to derive.
const nShards = 128

// shards is a copy-on-write sharded map. The array itself is copied by value
// into each new View; a shard's map is copied before its first change.
type shards[V any] [nShards]map[string]V

func shardOf(key string) int {
	// FNV-1a, inlined: no allocation on the lookup path.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h & (nShards - 1))
}

func (s *shards[V]) get(key string) (V, bool) {
	m := s[shardOf(key)]
	v, ok := m[key]
	return v, ok
}

// Service is the routable state of one (namespace, service): the contract
// identity a routing upsert replaces. A Service is immutable once it is in a
// View; share it freely.
type Service struct {
	Namespace, Name string
	DeployID        string
	Revision        int64
	Routes          []store.Route
	// Endpoints are routable instances only, in slot order: those of the
	// signed upsert that its machines' records admit
	// (store.CheckEndpoint); the others are never dialled.
	Endpoints []store.Endpoint
	// signed are the endpoints as the signed upsert named them, which
	// are admitted again when a machine's address changes.
	signed []store.Endpoint
	// HealthPath is where gateways probe an endpoint's health (the
	// service's readiness path); empty for a TCP connect.
	HealthPath string
	// Split, during a canary, divides the traffic between the endpoints
	// of Split.Revision and the others.
	Split *store.Split
	// Locality is the service's locality policy (nil: prefer), and
	// SlowStart the window over which a new endpoint's share ramps up.
	Locality  *store.Locality
	SlowStart time.Duration
	// Layer4 is what the service exposes below HTTP: gateway ports and
	// passthrough hosts (View.Layer4 indexes them).
	Layer4 store.Layer4

	memo sync.Map
	// digest is serviceDigest(s), computed on first use.
	digest atomic.Pointer[[2]uint64]
}

// event is the upsert that makes s again.
func (s *Service) event() *store.RoutingEvent {
	return &store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: s.Namespace,
		Service: s.Name, DeployID: s.DeployID, Revision: s.Revision, Routes: s.Routes, Endpoints: s.signed, HealthPath: s.HealthPath, Split: s.Split,
		Locality: s.Locality, SlowStart: store.Duration(s.SlowStart), Layer4: s.Layer4}
}

// Key is "<namespace>/<name>".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// Memo returns the value fn derives from s, computing it once per key. An
// adapter uses it to cache what it builds from an immutable Service (such as
// dial addresses) for exactly as long as the Service is current.
func (s *Service) Memo(key any, fn func(*Service) any) any {
	if v, ok := s.memo.Load(key); ok {
		return v
	}
	v, _ := s.memo.LoadOrStore(key, fn(s))
	return v
}

// hostRoute is one path prefix of one host, pointing at its service and
// the route (an index into its Routes) that gave it.
type hostRoute struct {
	Prefix  string
	Route   int
	Service *Service
}

// View is an immutable snapshot of the routing projection. Readers never
// lock: a Projection swaps whole Views atomically.
type View struct {
	// Seq is the last routing stream sequence this view reflects.
	Seq uint64
	// Stale is set when the view may be behind the store: loaded from the
	// local snapshot, or NATS is unreachable.
	Stale bool
	// BuiltAt is when this content was last changed.
	BuiltAt time.Time
	// StreamCreated identifies the routing stream Seq counts in; a stream
	// recreated under the same name has a new creation time.
	StreamCreated time.Time

	services shards[*Service]
	// exact maps a normalised host to its routes; wild maps the suffix of a
	// "*.suffix" host, with its leading dot (".example.com"), to its routes.
	// Routes are ordered longest prefix first.
	exact, wild shards[[]hostRoute]
	machines    shards[store.MachineRecord]
	// regions are the states set for regions by name; replaced, never
	// changed, once in a view.
	regions map[string]store.RegionRecord
	// machineRegions counts the machines of each region (those without
	// one left out); replaced, never changed, once in a view.
	machineRegions map[string]int
	// maintenance are the maintenance records by maintenanceKey, on or
	// off; replaced, never changed, once in a view.
	maintenance map[maintenanceKey]store.MaintenanceRecord

	numServices, numEndpoints, numMachines int
	// numSetAside counts the endpoints of signed upserts that no
	// machine record admits; aside are the keys of their services. The
	// map is replaced, never changed, once in a view.
	numSetAside int
	aside       map[string]bool
	// layer4 are the keys of the services with layer-4 entry points,
	// which View.Layer4 indexes; replaced, never changed, once in a view.
	layer4 map[string]bool
	lists  *lazyLists

	// down are the machines judged down (their beats stopped) when this
	// view was swapped in; nil when none is.
	down map[string]MachineDown
}

// lazyLists holds sorted lists derived on first use; shared between a view
// and its copies that differ only in Stale.
type lazyLists struct {
	once     sync.Once
	services []*Service
	machines []store.MachineRecord
	// The host list has its own once: the DNS index and the snapshot list
	// every new view's services and machines, nothing in them its hosts.
	hostsOnce sync.Once
	hosts     []string
	// knownRegions is View.KnownRegions, read once per view by gateways.
	regionsOnce  sync.Once
	knownRegions []string
	// l4 is View.Layer4, built on first use.
	l4Once sync.Once
	l4     *Layer4Index
	// The conflicts and the digest are read by reports and doctor only.
	conflictsOnce, digestOnce sync.Once
	conflicts                 []HostConflict
	digest                    string
}

// emptyView is what a projection serves before anything is known.
func emptyView(stale bool) *View {
	return &View{Stale: stale, BuiltAt: time.Now(), lists: new(lazyLists)}
}

// Lookup finds the service for a request's host and path: the exact host
// first, then "*.suffix" hosts from the most specific suffix; within a host,
// the longest path prefix that matches on a segment boundary. host may carry
// a port and any case or a trailing dot.
func (v *View) Lookup(host, path string) (*Service, bool) {
	m, ok := v.LookupRoute(host, path)
	return m.Service, ok
}

// Match is what a request matched: its service, the route of the service
// (with its policy) and the path prefix of the route that matched.
type Match struct {
	Service *Service
	// Route indexes Service.Routes.
	Route  int
	Prefix string
}

// RouteOf returns the matched route.
func (m Match) RouteOf() *store.Route { return &m.Service.Routes[m.Route] }

// LookupRoute is Lookup that also says which route and prefix matched.
func (v *View) LookupRoute(host, path string) (Match, bool) {
	h, ok := normalizeRequestHost(host)
	if !ok {
		return Match{}, false
	}
	if path == "" {
		path = "/"
	}
	if rs, ok := v.exact.get(h); ok {
		if r := matchPath(rs, path); r != nil {
			return Match{Service: r.Service, Route: r.Route, Prefix: r.Prefix}, true
		}
	}
	for i := 0; i < len(h); i++ {
		if h[i] != '.' {
			continue
		}
		if rs, ok := v.wild.get(h[i:]); ok {
			if r := matchPath(rs, path); r != nil {
				return Match{Service: r.Service, Route: r.Route, Prefix: r.Prefix}, true
			}
		}
	}
	return Match{}, false
}

// Routes reports whether any route names host (exact, or through a wildcard),
// whatever the path: the test for on-demand TLS.
func (v *View) Routes(host string) bool {
	h, ok := normalizeRequestHost(host)
	if !ok {
		return false
	}
	if _, ok := v.exact.get(h); ok {
		return true
	}
	for i := 0; i < len(h); i++ {
		if h[i] == '.' {
			if _, ok := v.wild.get(h[i:]); ok {
				return true
			}
		}
	}
	return false
}

// matchPath finds the route of path among a host's routes, which are
// sorted owner first (see builder.addHost): routes of any other namespace
// are never served.
func matchPath(rs []hostRoute, path string) *hostRoute {
	owner := rs[0].Service.Namespace
	for i := range rs {
		r := &rs[i]
		if r.Service.Namespace != owner {
			break
		}
		if prefixMatches(r.Prefix, path) {
			return r
		}
	}
	return nil
}

// prefixMatches matches on path segment boundaries: "/api" matches "/api"
// and "/api/x" but not "/apix"; "/" matches everything.
func prefixMatches(prefix, path string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || prefix[len(prefix)-1] == '/' || path[len(prefix)] == '/'
}

// Service returns the service namespace/name.
func (v *View) Service(namespace, name string) (*Service, bool) {
	return v.services.get(namespace + "/" + name)
}

// Machine returns the machine record of id.
func (v *View) Machine(id string) (store.MachineRecord, bool) { return v.machines.get(id) }

// Services lists every service sorted by namespace, then name.
func (v *View) Services() []*Service { v.fillLists(); return v.lists.services }

// Machines lists every machine sorted by ID.
func (v *View) Machines() []store.MachineRecord { v.fillLists(); return v.lists.machines }

// Hosts lists every routed host as configured ("*.suffix" for wildcards),
// normalised and sorted.
func (v *View) Hosts() []string {
	v.lists.hostsOnce.Do(func() {
		var hosts []string
		for _, m := range v.exact {
			for h := range m {
				hosts = append(hosts, h)
			}
		}
		for _, m := range v.wild {
			for h := range m {
				hosts = append(hosts, "*"+h)
			}
		}
		sort.Strings(hosts)
		v.lists.hosts = hosts
	})
	return v.lists.hosts
}

// HostConflict is a host that services of more than one namespace route.
// Only Owner's routes are served.
type HostConflict struct {
	Host   string   `json:"host"`
	Owner  string   `json:"owner"`
	Others []string `json:"others"`
}

// Conflicts lists the hosts more than one namespace routes, sorted by host:
// records the store's ownership check should have kept out. A gateway
// serves the lowest namespace of each (see matchPath).
func (v *View) Conflicts() []HostConflict {
	v.lists.conflictsOnce.Do(func() {
		var out []HostConflict
		find := func(idx *shards[[]hostRoute], prefix string) {
			for _, m := range idx {
				for host, rs := range m {
					// Sorted owner first: a conflict ends with another
					// namespace.
					if len(rs) < 2 || rs[len(rs)-1].Service.Namespace == rs[0].Service.Namespace {
						continue
					}
					c := HostConflict{Host: prefix + host, Owner: rs[0].Service.Namespace}
					for _, r := range rs {
						if ns := r.Service.Namespace; ns != c.Owner && !slices.Contains(c.Others, ns) {
							c.Others = append(c.Others, ns)
						}
					}
					out = append(out, c)
				}
			}
		}
		find(&v.exact, "")
		find(&v.wild, "*")
		sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
		v.lists.conflicts = out
	})
	return v.lists.conflicts
}

// Digest is a hash of what the view serves: every service with its routes
// and endpoints, from which each host's routes follow. Two views that route
// every request alike have the same digest whatever order their events came
// in, so a gateway's report can be checked against a rebuild from the store
// (control doctor). It is an order-free sum of per-service hashes, each
// computed once per immutable Service: a new view costs one pass over its
// services, no sorting.
func (v *View) Digest() string {
	v.lists.digestOnce.Do(func() {
		var sum [2]uint64
		for _, m := range v.services {
			for _, s := range m {
				h := s.digest.Load()
				if h == nil {
					d := serviceDigest(s)
					s.digest.Store(&d)
					h = &d
				}
				lo := sum[0] + h[0]
				carry := uint64(0)
				if lo < sum[0] {
					carry = 1
				}
				sum[0], sum[1] = lo, sum[1]+h[1]+carry
			}
		}
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], sum[1])
		binary.BigEndian.PutUint64(b[8:], sum[0])
		v.lists.digest = hex.EncodeToString(b[:])
	})
	return v.lists.digest
}

// serviceDigest hashes what a service contributes to routing.
func serviceDigest(s *Service) [2]uint64 {
	h := sha256.New()
	var buf []byte
	str := func(x string) {
		buf = binary.AppendUvarint(buf[:0], uint64(len(x)))
		h.Write(buf)
		h.Write([]byte(x))
	}
	num := func(x int64) {
		buf = binary.AppendVarint(buf[:0], x)
		h.Write(buf)
	}
	str(s.Namespace)
	str(s.Name)
	num(s.Revision)
	num(int64(len(s.Routes)))
	for _, r := range s.Routes {
		num(int64(len(r.Hosts)))
		for _, x := range r.Hosts {
			str(x)
		}
		num(int64(len(r.PathPrefixes)))
		for _, x := range r.PathPrefixes {
			str(x)
		}
	}
	if sp := s.Split; sp != nil {
		str(sp.Deploy)
		num(sp.Revision)
		num(int64(sp.Weight))
		if sp.Sticky {
			num(1)
		}
		if m := sp.Match; m != nil {
			str(m.Header)
			str(m.Cookie)
			str(m.Value)
		}
	}
	if l := s.Locality; l != nil {
		str(l.Policy)
		num(int64(len(l.Order)))
		for _, r := range l.Order {
			str(r)
		}
	}
	num(int64(s.SlowStart))
	l4 := &s.Layer4
	if !l4.Empty() || l4.DrainTimeout != 0 {
		// Only a service with layer-4 entry points hashes them, so
		// digests of views without any are as before.
		str("layer4")
		for _, k := range l4.Ports() {
			str(k.String())
		}
		for _, h := range l4.PassthroughHosts() {
			str(h)
		}
		num(int64(l4.DrainTimeout))
	}
	num(int64(len(s.Endpoints)))
	for _, ep := range s.Endpoints {
		str(ep.InstanceID)
		str(ep.Address)
		num(int64(ep.Port))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return [2]uint64{binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:16])}
}

// Counts returns the number of services, routable endpoints and machines.
func (v *View) Counts() (services, endpoints, machines int) {
	return v.numServices, v.numEndpoints, v.numMachines
}

// SetAside is the number of endpoints of signed upserts that are not
// dialled because their machine's record does not admit them
// (store.CheckEndpoint).
func (v *View) SetAside() int { return v.numSetAside }

// HostRoute is one (host, path prefix) -> service entry, for status pages.
type HostRoute struct {
	Host      string `json:"host"`
	Prefix    string `json:"path_prefix"`
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
}

// HostRoutes lists the routes of host exactly as configured (a wildcard host
// is given as "*.suffix"), longest prefix first.
func (v *View) HostRoutes(host string) []HostRoute {
	var rs []hostRoute
	if strings.HasPrefix(host, "*.") {
		h, ok := normalizeHost(host[1:])
		if !ok {
			return nil
		}
		rs, _ = v.wild.get(h)
	} else {
		h, ok := normalizeRequestHost(host)
		if !ok {
			return nil
		}
		rs, _ = v.exact.get(h)
	}
	out := make([]HostRoute, 0, len(rs))
	for _, r := range rs {
		if r.Service.Namespace != rs[0].Service.Namespace {
			break // not served: see matchPath
		}
		out = append(out, HostRoute{Host: host, Prefix: r.Prefix, Namespace: r.Service.Namespace, Service: r.Service.Name})
	}
	return out
}

func (v *View) fillLists() {
	v.lists.once.Do(func() {
		svcs := make([]*Service, 0, v.numServices)
		for _, m := range v.services {
			for _, s := range m {
				svcs = append(svcs, s)
			}
		}
		sort.Slice(svcs, func(i, j int) bool {
			if svcs[i].Namespace != svcs[j].Namespace {
				return svcs[i].Namespace < svcs[j].Namespace
			}
			return svcs[i].Name < svcs[j].Name
		})
		ms := make([]store.MachineRecord, 0, v.numMachines)
		for _, m := range v.machines {
			for _, r := range m {
				ms = append(ms, r)
			}
		}
		sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
		v.lists.services, v.lists.machines = svcs, ms
	})
}

// withStale returns v itself if it already has the stale flag, else a copy
// that differs only in it (sharing every index).
func (v *View) withStale(stale bool) *View {
	if v.Stale == stale {
		return v
	}
	c := *v
	c.Stale = stale
	return &c
}

// withDown returns a copy of v with down as the machines judged down.
func (v *View) withDown(down map[string]MachineDown) *View {
	c := *v
	c.down = down
	return &c
}

// Down reports whether machine's instances are set aside because its
// heartbeats stopped, and how it was judged.
func (v *View) Down(machine string) (MachineDown, bool) {
	d, ok := v.down[machine]
	return d, ok
}

// AnyDown reports whether some machine is judged down.
func (v *View) AnyDown() bool { return len(v.down) > 0 }

// LiveEndpoints returns svc's endpoints on machines not judged down; when
// every one of them is, it returns them all and failOpen (serving a
// machine that may be gone beats serving nothing).
func (v *View) LiveEndpoints(svc *Service) (eps []store.Endpoint, failOpen bool) {
	if len(v.down) == 0 {
		return svc.Endpoints, false
	}
	eps = make([]store.Endpoint, 0, len(svc.Endpoints))
	for _, e := range svc.Endpoints {
		if _, down := v.down[e.Machine]; !down {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 && len(svc.Endpoints) > 0 {
		return svc.Endpoints, true
	}
	return eps, false
}

// normalizeRequestHost lower-cases host, drops a port and a trailing dot,
// and converts an internationalised name to its ASCII form. The common case
// (already lower-case ASCII, no port) does not allocate.
func normalizeRequestHost(host string) (string, bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		if strings.HasPrefix(host, "[") {
			// IPv6 literal: "[::1]:8080" or "[::1]".
			if j := strings.IndexByte(host, ']'); j > 0 {
				host = host[1:j]
			}
		} else if strings.IndexByte(host, ':') == i {
			host = host[:i]
		}
	}
	return normalizeHost(host)
}

// normalizeHost canonicalises a host name: lower case, no trailing dot,
// IDNA ASCII form. It reports false for an empty or invalid name.
func normalizeHost(host string) (string, bool) {
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return "", false
	}
	simple := true
	for i := 0; i < len(host); i++ {
		c := host[i]
		if c >= utf8.RuneSelf || (c >= 'A' && c <= 'Z') {
			simple = false
			break
		}
	}
	if simple {
		return host, true
	}
	a, err := idna.Lookup.ToASCII(host)
	if err != nil {
		// Not a valid IDNA name; fall back to plain lower-casing so a
		// literal such as an IPv6 address still matches itself.
		a = strings.ToLower(host)
	}
	return strings.ToLower(a), true
}

// NormalizeHost is the canonical form of a host under which the projection
// indexes routes (lower case, no port or trailing dot, IDNA ASCII). A
// "*.suffix" wildcard keeps its "*.".
func NormalizeHost(host string) (string, bool) {
	if strings.HasPrefix(host, "*.") {
		h, ok := normalizeHost(host[2:])
		return "*." + h, ok
	}
	return normalizeRequestHost(host)
}
