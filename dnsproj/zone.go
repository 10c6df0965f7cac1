package dnsproj

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// zone is the "projection" link: authoritative for the cluster zone, built
// from the projection's current view. Names under the zone:
//
//	<zone>                                 SOA, NS
//	ns.<zone>                              A/AAAA of Config.NSAddrs
//	<service>.<namespace>.<zone>           A/AAAA of routable instances, SRV
//	                                       (by region: see locality.go)
//	_http._tcp.<service>.<namespace>.<zone> SRV
//	_tcp.<service>.<namespace>.<zone>      SRV, for a service with tcp ports
//	_udp.<service>.<namespace>.<zone>      SRV, for a service with udp ports
//	<instance>.<service>.<namespace>.<zone> A/AAAA of that instance
//	<machine>.machines.<zone>              A/AAAA of the machine's overlay IP
//
// Anything else under the zone is NXDOMAIN; a name with no records of the
// asked type is NODATA; both carry the SOA in the authority section.
// Names outside the zone go to the next link.
type zone struct {
	origin    string // lower case, trailing dot
	dotOrigin string // "." + origin
	// region is the server's, else regionFor(view) is: the index of a
	// view answers as a reader there, and the region is fixed for the
	// zone's life or a function of the view, so the index stays keyed on
	// the view alone.
	region    string
	regionFor func(View) string
	nearest   func() ([]string, uint64)
	ttl       uint32
	nsAddrs   []netip.Addr
	src       Source
	next      Handler
	log       *zap.Logger
	m         *metrics

	mu  sync.Mutex // serialises rebuilds
	idx atomic.Pointer[zoneIndex]
}

func newZone(origin, region string, regionFor func(View) string, nearest func() ([]string, uint64), ttl time.Duration, nsAddrs []netip.Addr, src Source, log *zap.Logger, m *metrics) *zone {
	return &zone{
		origin: origin, dotOrigin: "." + origin, region: region, regionFor: regionFor, nearest: nearest, ttl: uint32(ttl / time.Second),
		nsAddrs: nsAddrs, src: src, log: log, m: m,
	}
}

func (z *zone) plugin(next Handler) Handler {
	z.next = next
	return z
}

func (z *zone) Name() string { return "projection" }

// inZone reports whether the lower-case name is the origin or below it.
func (z *zone) inZone(lname string) bool {
	return lname == z.origin || (len(lname) > len(z.dotOrigin) && lname[len(lname)-len(z.dotOrigin):] == z.dotOrigin)
}

// index returns the index of the current view, rebuilding it first when
// the projection moved on: a change is visible in the very next answer.
func (z *zone) index() *zoneIndex {
	v, seq, stale := z.src.Current()
	var nearest []string
	var nearVer uint64
	if z.nearest != nil {
		nearest, nearVer = z.nearest()
	}
	current := func(idx *zoneIndex) bool {
		return idx != nil && idx.view == v && idx.seq == seq && idx.stale == stale && idx.nearVer == nearVer
	}
	if idx := z.idx.Load(); current(idx) {
		return idx
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if idx := z.idx.Load(); current(idx) {
		return idx
	}
	region := z.region
	if region == "" && z.regionFor != nil && v != nil {
		region = z.regionFor(v)
	}
	idx := buildIndex(z.origin, region, nearest, z.ttl, z.nsAddrs, v, seq, stale, z.log)
	idx.nearVer = nearVer
	z.idx.Store(idx)
	z.m.viewSeq.Set(float64(seq))
	if stale {
		z.m.viewStale.Set(1)
	} else {
		z.m.viewStale.Set(0)
	}
	return idx
}

func (z *zone) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	q := r.Question[0]
	lname := lowerASCII(q.Name)
	if !z.inZone(lname) {
		return z.next.ServeDNS(ctx, w, r)
	}
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		return dns.RcodeRefused, nil
	}
	if q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		return dns.RcodeRefused, nil // no zone transfers
	}
	idx := z.index()
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	n := idx.names[lname]
	if n == nil {
		m.Rcode = dns.RcodeNameError
		m.Ns = idx.soa
		return dns.RcodeNameError, w.WriteMsg(m)
	}
	answer, extra := n.lookup(q.Qtype)
	if len(answer) == 0 {
		m.Ns = idx.soa // NODATA
		return dns.RcodeSuccess, w.WriteMsg(m)
	}
	if q.Name != lname {
		// Echo the asker's spelling (0x20 clients check it); the index
		// holds lower case.
		answer = withOwner(answer, q.Name)
	}
	m.Answer = answer
	m.Extra = extra
	return dns.RcodeSuccess, w.WriteMsg(m)
}

func withOwner(rrs []dns.RR, owner string) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		c := dns.Copy(rr)
		c.Header().Name = owner
		out[i] = c
	}
	return out
}

// zoneIndex is the zone of one view, every answer precomputed. It is
// immutable once built; answers share its slices, capped (len == cap) so
// an append anywhere down the line copies instead of writing into them.
type zoneIndex struct {
	view  View
	seq   uint64
	stale bool
	// nearVer is the version of the nearest order it was built with.
	nearVer uint64
	names   map[string]*node
	soa     []dns.RR
}

// node is one name of the zone; an empty node is an empty non-terminal
// (a name with children and no records: NODATA, not NXDOMAIN).
type node struct {
	a, aaaa, srv, ns, soa []dns.RR
	srvExtra, nsExtra     []dns.RR
	all                   []dns.RR // for ANY
}

func (n *node) lookup(qtype uint16) (answer, extra []dns.RR) {
	switch qtype {
	case dns.TypeA:
		return n.a, nil
	case dns.TypeAAAA:
		return n.aaaa, nil
	case dns.TypeSRV:
		return n.srv, n.srvExtra
	case dns.TypeNS:
		return n.ns, n.nsExtra
	case dns.TypeSOA:
		return n.soa, nil
	case dns.TypeANY:
		return n.all, nil
	}
	return nil, nil
}

type indexBuilder struct {
	origin  string
	region  string       // the server's; "" serves every active region alike
	nearest []string     // the other regions, nearest first, where known
	tiers   []servedTier // scratch, reused service after service
	owners  []srvOwner   // scratch, reused service after service
	ttl     uint32
	names   map[string]*node
	log     *zap.Logger
}

func buildIndex(origin, region string, nearest []string, ttl uint32, nsAddrs []netip.Addr, v View, seq uint64, stale bool, log *zap.Logger) *zoneIndex {
	b := &indexBuilder{origin: origin, region: region, nearest: nearest, ttl: ttl, names: make(map[string]*node), log: log}
	idx := &zoneIndex{view: v, seq: seq, stale: stale, names: b.names}

	nsName := "ns." + origin
	soa := &dns.SOA{
		Hdr: b.hdr(origin, dns.TypeSOA), Ns: nsName, Mbox: "hostmaster." + origin,
		// The routing sequence orders views; its low 32 bits serve as the
		// serial (RFC 1982 arithmetic copes with the wrap).
		Serial: uint32(seq), Refresh: 60, Retry: 30, Expire: 3600, Minttl: ttl,
	}
	idx.soa = capped([]dns.RR{soa})
	apex := b.node(origin)
	apex.soa = idx.soa
	apex.ns = capped([]dns.RR{&dns.NS{Hdr: b.hdr(origin, dns.TypeNS), Ns: nsName}})
	ns := b.node(nsName)
	for _, a := range nsAddrs {
		b.addAddr(ns, nsName, a)
	}
	apex.nsExtra = capped(append(append([]dns.RR{}, ns.a...), ns.aaaa...))

	if v != nil {
		b.addServices(v)
		b.addMachines(v.Machines())
	}
	for _, n := range b.names {
		n.a, n.aaaa, n.srv, n.srvExtra = capped(n.a), capped(n.aaaa), capped(n.srv), capped(n.srvExtra)
		n.all = capped(append(append(append(append(append([]dns.RR{}, n.soa...), n.ns...), n.a...), n.aaaa...), n.srv...))
	}
	return idx
}

func (b *indexBuilder) addServices(v View) {
	for _, svc := range v.Services() {
		nsl, ok1 := dnsLabel(svc.Namespace)
		sl, ok2 := dnsLabel(svc.Name)
		if !ok1 || !ok2 {
			b.log.Warn("dns: service name is not a DNS label; not in the zone",
				zap.String("namespace", svc.Namespace), zap.String("service", svc.Name))
			continue
		}
		if nsl == "machines" {
			b.log.Warn("dns: namespace \"machines\" is shadowed by machines.<zone>; its services are not in the zone",
				zap.String("service", svc.Name))
			continue
		}
		base := sl + "." + nsl + "." + b.origin
		if len(base) > 200 { // leaves room for the instance label below
			continue
		}
		svcNode := b.node(base)
		srvName := "_http._tcp." + base
		b.owners = append(b.owners[:0], srvOwner{svcNode, base}, srvOwner{b.node(srvName), srvName})
		// A service reached below HTTP is also found by its protocol
		// (RFC 2782's _proto label): the same instances, since a gateway
		// forwards its tcp/udp ports to the instances' own port.
		if len(svc.Layer4.TCP) > 0 {
			b.owners = append(b.owners, srvOwner{b.node("_tcp." + base), "_tcp." + base})
		}
		if len(svc.Layer4.UDP) > 0 {
			b.owners = append(b.owners, srvOwner{b.node("_udp." + base), "_udp." + base})
		}
		// A machine whose heartbeats stopped is left out of the answers
		// while the service has instances elsewhere; its region's
		// other instances, and other regions, are tried first.
		b.tiers = servedTiers(v, svc, b.region, b.nearest, b.tiers[:0])
		for i, t := range b.tiers {
			b.addTier(svc, t, i == 0, base, svcNode, b.owners)
		}
	}
}

// srvOwner is a name that answers a service's SRV records, and its node.
type srvOwner struct {
	n    *node
	name string
}

// addTier adds tier t of svc: an instance name per endpoint, SRV records
// at the tier's priority under every owner, and, for the first tier only,
// the A and AAAA records of the service's name.
func (b *indexBuilder) addTier(svc *projection.Service, t servedTier, first bool, base string, svcNode *node, owners []srvOwner) {
	var seen map[netip.Addr]bool
	if first {
		seen = make(map[netip.Addr]bool)
	}
	// During a canary each side's SRV weights add up to its share,
	// within the tier; a side with none (the new revision at 0%, the
	// old at 100%) is answered under its instance names only.
	weights := svc.SRVWeights(t.eps)
	for i, ep := range t.eps {
		ip, err := netip.ParseAddr(ep.Address)
		if err != nil || ep.Port <= 0 || ep.Port > 65535 {
			continue
		}
		ip = ip.Unmap()
		target := instanceLabel(ep) + "." + base
		inst := b.node(target)
		b.addAddr(inst, target, ip)
		if weights[i] == 0 {
			continue
		}
		if first && !seen[ip] {
			seen[ip] = true
			b.addAddr(svcNode, base, ip)
		}
		for _, owner := range owners {
			owner.n.srv = append(owner.n.srv, &dns.SRV{
				Hdr: b.hdr(owner.name, dns.TypeSRV), Priority: t.priority, Weight: weights[i],
				Port: uint16(ep.Port), Target: target,
			})
			owner.n.srvExtra = append(owner.n.srvExtra, inst.a...)
			owner.n.srvExtra = append(owner.n.srvExtra, inst.aaaa...)
		}
	}
}

func (b *indexBuilder) addMachines(machines []store.MachineRecord) {
	for _, mr := range machines {
		l, ok := dnsLabel(mr.ID)
		if !ok {
			continue
		}
		ip, err := netip.ParseAddr(mr.Address)
		if err != nil {
			continue // not on the mesh yet
		}
		name := l + ".machines." + b.origin
		b.addAddr(b.node(name), name, ip.Unmap())
	}
}

func (b *indexBuilder) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: b.ttl}
}

func (b *indexBuilder) addAddr(n *node, name string, ip netip.Addr) {
	if ip.Is4() {
		n.a = append(n.a, &dns.A{Hdr: b.hdr(name, dns.TypeA), A: ip.AsSlice()})
	} else {
		n.aaaa = append(n.aaaa, &dns.AAAA{Hdr: b.hdr(name, dns.TypeAAAA), AAAA: ip.AsSlice()})
	}
}

// node returns the node of name, creating it and its empty ancestors up to
// the origin.
func (b *indexBuilder) node(name string) *node {
	n := b.names[name]
	if n != nil {
		return n
	}
	n = &node{}
	b.names[name] = n
	for p := name; p != b.origin; {
		i := indexByte(p, '.')
		if i < 0 || i == len(p)-1 {
			break
		}
		p = p[i+1:]
		if _, ok := b.names[p]; ok {
			break
		}
		b.names[p] = &node{}
	}
	return n
}

// instanceLabel names an endpoint's own record: its instance ID when that
// is a DNS label, else its slot.
func instanceLabel(ep store.Endpoint) string {
	if l, ok := dnsLabel(ep.InstanceID); ok {
		return l
	}
	return "slot-" + strconv.Itoa(ep.Slot)
}

// dnsLabel lower-cases s and reports whether it is one DNS label of
// letters, digits, '-' and '_'.
func dnsLabel(s string) (string, bool) {
	if len(s) == 0 || len(s) > 63 {
		return "", false
	}
	s = lowerASCII(s)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", false
		}
	}
	return s, true
}

// lowerASCII lower-cases ASCII letters, allocating only when s has upper
// case (miekg/dns presents names escaped, so they are ASCII).
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + ('a' - 'A')
				}
			}
			return string(b)
		}
	}
	return s
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// capped returns s with its capacity cut to its length.
func capped(s []dns.RR) []dns.RR {
	if len(s) == 0 {
		return nil
	}
	return s[:len(s):len(s)]
}
