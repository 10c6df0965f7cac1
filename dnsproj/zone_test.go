package dnsproj

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// fixtureView is the cluster the table tests answer from.
func fixtureView() *memView {
	return &memView{
		services: []*projection.Service{
			svc("shop", "web",
				ep("i-web-2", 1, "10.100.0.6", 8081),
				ep("i-web-1", 0, "10.100.0.5", 8080),
				ep("i-web-3", 2, "fd00::7", 9000)),
			svc("shop", "api"), // nothing routable
			svc("ops", "Metrics", ep("I-M-1", 0, "10.100.0.9", 9100)),
			svc("bad", "we b", ep("x", 0, "10.100.0.10", 1)), // not a DNS label: left out
		},
		machines: []store.MachineRecord{
			{ID: "m1", Address: "10.100.0.1", State: store.MachineActive},
			{ID: "m2", Address: "fd00::2", State: store.MachineActive},
			{ID: "m3", State: store.MachineActive}, // not on the mesh yet
		},
	}
}

const soaLine = "edgeplane.internal. 5 IN SOA ns.edgeplane.internal. hostmaster.edgeplane.internal. 7 60 30 3600 5"

// TestZoneTable runs every record type and rcode of the zone over real UDP
// and TCP sockets.
func TestZoneTable(t *testing.T) {
	src := &memSource{}
	src.set(fixtureView(), 7)
	_, addr := startServer(t, Config{NSAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}, src)

	const z = "edgeplane.internal."
	cases := []struct {
		name   string
		qname  string
		qtype  uint16
		qclass uint16
		rcode  int
		answer []string
		ns     []string
		extra  []string
	}{
		{name: "service A", qname: "web.shop." + z, qtype: dns.TypeA, answer: []string{
			"web.shop.edgeplane.internal. 5 IN A 10.100.0.5", "web.shop.edgeplane.internal. 5 IN A 10.100.0.6"}},
		{name: "service AAAA", qname: "web.shop." + z, qtype: dns.TypeAAAA, answer: []string{
			"web.shop.edgeplane.internal. 5 IN AAAA fd00::7"}},
		{name: "service SRV", qname: "web.shop." + z, qtype: dns.TypeSRV, answer: []string{
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 i-web-1.web.shop.edgeplane.internal.",
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 8081 i-web-2.web.shop.edgeplane.internal.",
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 9000 i-web-3.web.shop.edgeplane.internal.",
		}, extra: []string{
			"i-web-1.web.shop.edgeplane.internal. 5 IN A 10.100.0.5",
			"i-web-2.web.shop.edgeplane.internal. 5 IN A 10.100.0.6",
			"i-web-3.web.shop.edgeplane.internal. 5 IN AAAA fd00::7",
		}},
		{name: "_http._tcp SRV", qname: "_http._tcp.web.shop." + z, qtype: dns.TypeSRV, answer: []string{
			"_http._tcp.web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 i-web-1.web.shop.edgeplane.internal.",
			"_http._tcp.web.shop.edgeplane.internal. 5 IN SRV 0 10 8081 i-web-2.web.shop.edgeplane.internal.",
			"_http._tcp.web.shop.edgeplane.internal. 5 IN SRV 0 10 9000 i-web-3.web.shop.edgeplane.internal.",
		}, extra: []string{
			"i-web-1.web.shop.edgeplane.internal. 5 IN A 10.100.0.5",
			"i-web-2.web.shop.edgeplane.internal. 5 IN A 10.100.0.6",
			"i-web-3.web.shop.edgeplane.internal. 5 IN AAAA fd00::7",
		}},
		{name: "instance A", qname: "i-web-1.web.shop." + z, qtype: dns.TypeA, answer: []string{
			"i-web-1.web.shop.edgeplane.internal. 5 IN A 10.100.0.5"}},
		{name: "upper-case service and instance are lowered", qname: "metrics.ops." + z, qtype: dns.TypeSRV, answer: []string{
			"metrics.ops.edgeplane.internal. 5 IN SRV 0 10 9100 i-m-1.metrics.ops.edgeplane.internal."},
			extra: []string{"i-m-1.metrics.ops.edgeplane.internal. 5 IN A 10.100.0.9"}},
		{name: "machine A", qname: "m1.machines." + z, qtype: dns.TypeA, answer: []string{
			"m1.machines.edgeplane.internal. 5 IN A 10.100.0.1"}},
		{name: "machine AAAA", qname: "m2.machines." + z, qtype: dns.TypeAAAA, answer: []string{
			"m2.machines.edgeplane.internal. 5 IN AAAA fd00::2"}},
		{name: "machine without address", qname: "m3.machines." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "apex SOA", qname: z, qtype: dns.TypeSOA, answer: []string{soaLine}},
		{name: "apex NS", qname: z, qtype: dns.TypeNS, answer: []string{
			"edgeplane.internal. 5 IN NS ns.edgeplane.internal."},
			extra: []string{"ns.edgeplane.internal. 5 IN A 127.0.0.1"}},
		{name: "name server A", qname: "ns." + z, qtype: dns.TypeA, answer: []string{"ns.edgeplane.internal. 5 IN A 127.0.0.1"}},
		{name: "apex ANY", qname: z, qtype: dns.TypeANY, answer: []string{
			"edgeplane.internal. 5 IN NS ns.edgeplane.internal.", soaLine}},
		{name: "service ANY", qname: "web.shop." + z, qtype: dns.TypeANY, answer: []string{
			"web.shop.edgeplane.internal. 5 IN A 10.100.0.5", "web.shop.edgeplane.internal. 5 IN A 10.100.0.6",
			"web.shop.edgeplane.internal. 5 IN AAAA fd00::7",
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 i-web-1.web.shop.edgeplane.internal.",
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 8081 i-web-2.web.shop.edgeplane.internal.",
			"web.shop.edgeplane.internal. 5 IN SRV 0 10 9000 i-web-3.web.shop.edgeplane.internal.",
		}},
		{name: "NXDOMAIN service", qname: "missing.shop." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "NXDOMAIN below a leaf", qname: "x.i-web-1.web.shop." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "NXDOMAIN unknown namespace", qname: "web.nope." + z, qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "invalid service name left out", qname: `we\ b.bad.` + z, qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "NODATA wrong type", qname: "web.shop." + z, qtype: dns.TypeTXT, ns: []string{soaLine}},
		{name: "NODATA A at an SRV name", qname: "_http._tcp.web.shop." + z, qtype: dns.TypeA, ns: []string{soaLine}},
		{name: "NODATA service without routable instances", qname: "api.shop." + z, qtype: dns.TypeA, ns: []string{soaLine}},
		{name: "NODATA namespace (empty non-terminal)", qname: "shop." + z, qtype: dns.TypeA, ns: []string{soaLine}},
		{name: "NODATA machines (empty non-terminal)", qname: "machines." + z, qtype: dns.TypeA, ns: []string{soaLine}},
		{name: "NODATA AAAA of an IPv4-only machine", qname: "m1.machines." + z, qtype: dns.TypeAAAA, ns: []string{soaLine}},
		{name: "mixed case echoes the asker's spelling", qname: "WEB.Shop.EdgePlane.INTERNAL.", qtype: dns.TypeA, answer: []string{
			"WEB.Shop.EdgePlane.INTERNAL. 5 IN A 10.100.0.5", "WEB.Shop.EdgePlane.INTERNAL. 5 IN A 10.100.0.6"}},
		{name: "mixed case NXDOMAIN", qname: "NOPE.Shop.EDGEPLANE.internal.", qtype: dns.TypeA, rcode: dns.RcodeNameError, ns: []string{soaLine}},
		{name: "outside the zone, no forwarder: REFUSED", qname: "example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused},
		{name: "suffix without a label boundary is outside", qname: "xedgeplane.internal.", qtype: dns.TypeA, rcode: dns.RcodeRefused},
		{name: "zone transfer refused", qname: z, qtype: dns.TypeAXFR, rcode: dns.RcodeRefused},
		{name: "CHAOS class refused", qname: "web.shop." + z, qtype: dns.TypeTXT, qclass: dns.ClassCHAOS, rcode: dns.RcodeRefused},
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			if tc.qtype == dns.TypeAXFR && proto == "udp" {
				continue
			}
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				q := query(tc.qname, tc.qtype)
				if tc.qclass != 0 {
					q.Question[0].Qclass = tc.qclass
				}
				r := ask(t, proto, addr, q)
				if r.Rcode != tc.rcode {
					t.Fatalf("rcode %s, want %s\n%s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode], r)
				}
				if r.Question[0].Name != tc.qname {
					t.Errorf("question echoed as %q, want %q", r.Question[0].Name, tc.qname)
				}
				inZone := strings.HasSuffix(strings.ToLower(tc.qname), "."+z) || strings.EqualFold(tc.qname, z)
				if r.Authoritative != (inZone && tc.rcode != dns.RcodeRefused) {
					t.Errorf("AA = %v", r.Authoritative)
				}
				if r.Truncated {
					t.Errorf("unexpected TC")
				}
				check := func(section string, got []dns.RR, want []string) {
					t.Helper()
					g := rrStrings(got)
					w := slices.Clone(want)
					slices.Sort(w)
					if !slices.Equal(g, w) {
						t.Errorf("%s:\n got %q\nwant %q", section, g, w)
					}
				}
				check("answer", r.Answer, tc.answer)
				check("authority", r.Ns, tc.ns)
				check("additional", r.Extra, tc.extra)
			})
		}
	}
}

// TestZoneFollowsView shows a new view answered by the very next query:
// new addresses served, old ones gone, SOA serial moved.
func TestZoneFollowsView(t *testing.T) {
	src := &memSource{}
	src.set(&memView{services: []*projection.Service{svc("shop", "web", ep("a", 0, "10.0.0.1", 80))}}, 1)
	_, addr := startServer(t, Config{}, src)

	r := ask(t, "udp", addr, query("web.shop.edgeplane.internal.", dns.TypeA))
	if got := rrStrings(r.Answer); !slices.Equal(got, []string{"web.shop.edgeplane.internal. 5 IN A 10.0.0.1"}) {
		t.Fatalf("before: %q", got)
	}
	src.set(&memView{services: []*projection.Service{svc("shop", "web", ep("b", 0, "10.0.0.2", 80))}}, 2)
	r = ask(t, "udp", addr, query("web.shop.edgeplane.internal.", dns.TypeA))
	if got := rrStrings(r.Answer); !slices.Equal(got, []string{"web.shop.edgeplane.internal. 5 IN A 10.0.0.2"}) {
		t.Fatalf("after: %q", got)
	}
	r = ask(t, "udp", addr, query("a.web.shop.edgeplane.internal.", dns.TypeA))
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("old instance name: %s", dns.RcodeToString[r.Rcode])
	}
	if soa := r.Ns[0].(*dns.SOA); soa.Serial != 2 {
		t.Fatalf("serial %d, want 2", soa.Serial)
	}
	src.set(&memView{}, 3)
	r = ask(t, "tcp", addr, query("web.shop.edgeplane.internal.", dns.TypeA))
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("removed service: %s", dns.RcodeToString[r.Rcode])
	}
}

// TestZoneTTLAndOrigin checks a custom zone (any case, no trailing dot) and
// TTL.
func TestZoneTTLAndOrigin(t *testing.T) {
	src := &memSource{}
	src.set(&memView{services: []*projection.Service{svc("ns1", "s", ep("a", 0, "10.0.0.1", 80))}}, 1)
	_, addr := startServer(t, Config{Zone: "Cluster.Example", TTL: 30e9}, src)
	r := ask(t, "udp", addr, query("s.ns1.cluster.example.", dns.TypeA))
	if got := rrStrings(r.Answer); !slices.Equal(got, []string{"s.ns1.cluster.example. 30 IN A 10.0.0.1"}) {
		t.Fatalf("answer %q", got)
	}
	r = ask(t, "udp", addr, query("s.ns1.edgeplane.internal.", dns.TypeA))
	if r.Rcode != dns.RcodeRefused {
		t.Fatalf("default zone no longer served: %s", dns.RcodeToString[r.Rcode])
	}
}

func TestConfigErrors(t *testing.T) {
	src := &memSource{}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"root zone", Config{Zone: "."}, "root zone"},
		{"bad zone", Config{Zone: "a..b"}, "not a domain name"},
		{"ttl too short", Config{TTL: 1}, "ttl"},
		{"udp size", Config{MaxUDPSize: 100}, "max udp size"},
		{"query size", Config{MaxQuerySize: 70000}, "max query size"},
		{"forward policy", Config{Forward: ForwardConfig{Upstreams: []string{"127.0.0.1"}, Policy: "fastest"}}, "policy"},
		{"forward hostname", Config{Forward: ForwardConfig{Upstreams: []string{"dns.google"}}}, "must be an IP address"},
		{"forward port", Config{Forward: ForwardConfig{Upstreams: []string{"127.0.0.1:99999"}}}, "bad port"},
		{"forward duplicate", Config{Forward: ForwardConfig{Upstreams: []string{"127.0.0.1", "127.0.0.1:53"}}}, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Fatal("a nil source was accepted")
	}
}

// During a canary each side's SRV weights add up to its share of the
// split; a side at 0% is answered under its instance names only.
func TestCanarySplitSRVWeights(t *testing.T) {
	split := func(weight int) *memView {
		web := svc("shop", "web",
			ep("i-old-1", 0, "10.100.0.5", 8080), ep("i-old-2", 1, "10.100.0.6", 8080),
			store.Endpoint{InstanceID: "i-new-1", Machine: "m1", Slot: 0, Revision: 2, Address: "10.100.0.7", Port: 8080})
		web.Split = &store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: weight}
		return &memView{services: []*projection.Service{web}}
	}
	src := &memSource{}
	src.set(split(10), 1)
	_, addr := startServer(t, Config{}, src)
	const name = "web.shop.edgeplane.internal."
	if _, got := answers(t, "udp", addr, name, dns.TypeSRV); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN SRV 0 1000 8080 i-new-1.web.shop.edgeplane.internal.",
		"web.shop.edgeplane.internal. 5 IN SRV 0 4500 8080 i-old-1.web.shop.edgeplane.internal.",
		"web.shop.edgeplane.internal. 5 IN SRV 0 4500 8080 i-old-2.web.shop.edgeplane.internal.",
	}) {
		t.Fatalf("SRV at 10%%: %q", got)
	}
	src.set(split(0), 2)
	if _, got := answers(t, "udp", addr, name, dns.TypeA); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN A 10.100.0.5", "web.shop.edgeplane.internal. 5 IN A 10.100.0.6"}) {
		t.Fatalf("A at 0%%: %q", got)
	}
	if _, got := answers(t, "udp", addr, "i-new-1."+name, dns.TypeA); !slices.Equal(got, []string{"i-new-1.web.shop.edgeplane.internal. 5 IN A 10.100.0.7"}) {
		t.Fatalf("the new instance's own name at 0%%: %q", got)
	}
	src.set(split(100), 3)
	if _, got := answers(t, "udp", addr, name, dns.TypeSRV); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN SRV 0 10000 8080 i-new-1.web.shop.edgeplane.internal."}) {
		t.Fatalf("SRV at 100%%: %q", got)
	}
}
