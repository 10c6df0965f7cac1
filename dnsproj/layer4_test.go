package dnsproj

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// l4svc is svc exposing l4 below HTTP.
func l4svc(ns, name string, l4 store.Layer4, eps ...store.Endpoint) *projection.Service {
	s := svc(ns, name, eps...)
	s.Layer4 = l4
	return s
}

// TestZoneLayer4SRV: a service with tcp ports answers SRV at _tcp.<service>,
// one with udp ports at _udp.<service>, with the records _http._tcp has;
// _udp of a service without udp ports is NXDOMAIN, _tcp of one without
// tcp ports stays the empty non-terminal above _http._tcp (NODATA, as
// before), and a service without routable instances answers NODATA.
func TestZoneLayer4SRV(t *testing.T) {
	tcpUDP := store.Layer4{TCP: []store.L4Port{{Port: 5432}}, UDP: []store.L4Port{{Port: 5353}}}
	src := &memSource{}
	src.set(&memView{services: []*projection.Service{
		l4svc("shop", "db", tcpUDP, ep("i-db-2", 1, "10.100.0.6", 5432), ep("i-db-1", 0, "10.100.0.5", 5432)),
		l4svc("shop", "mq", store.Layer4{TCP: []store.L4Port{{Port: 1883}}}, ep("i-mq-1", 0, "fd00::9", 1883)),
		l4svc("shop", "dns", store.Layer4{UDP: []store.L4Port{{Port: 53}}}), // nothing routable
		l4svc("shop", "tls", store.Layer4{TLSPassthrough: &store.Passthrough{Hosts: []string{"db.example.com"}}}, ep("i-tls-1", 0, "10.100.0.8", 8443)),
		svc("shop", "web", ep("i-web-1", 0, "10.100.0.7", 8080)),
	}}, 7)
	_, addr := startServer(t, Config{}, src)
	const z = "edgeplane.internal."
	srv := func(owner string, port int, target string) string {
		return owner + " 5 IN SRV 0 10 " + strconv.Itoa(port) + " " + target + "." + z
	}
	cases := []struct {
		name   string
		qname  string
		qtype  uint16
		rcode  int
		answer []string
		extra  []string
	}{
		{name: "_tcp SRV", qname: "_tcp.db.shop." + z, qtype: dns.TypeSRV, answer: []string{
			srv("_tcp.db.shop."+z, 5432, "i-db-1.db.shop"), srv("_tcp.db.shop."+z, 5432, "i-db-2.db.shop")},
			extra: []string{"i-db-1.db.shop.edgeplane.internal. 5 IN A 10.100.0.5", "i-db-2.db.shop.edgeplane.internal. 5 IN A 10.100.0.6"}},
		{name: "_udp SRV", qname: "_udp.db.shop." + z, qtype: dns.TypeSRV, answer: []string{
			srv("_udp.db.shop."+z, 5432, "i-db-1.db.shop"), srv("_udp.db.shop."+z, 5432, "i-db-2.db.shop")},
			extra: []string{"i-db-1.db.shop.edgeplane.internal. 5 IN A 10.100.0.5", "i-db-2.db.shop.edgeplane.internal. 5 IN A 10.100.0.6"}},
		{name: "_http._tcp is unchanged", qname: "_http._tcp.db.shop." + z, qtype: dns.TypeSRV, answer: []string{
			srv("_http._tcp.db.shop."+z, 5432, "i-db-1.db.shop"), srv("_http._tcp.db.shop."+z, 5432, "i-db-2.db.shop")},
			extra: []string{"i-db-1.db.shop.edgeplane.internal. 5 IN A 10.100.0.5", "i-db-2.db.shop.edgeplane.internal. 5 IN A 10.100.0.6"}},
		{name: "_tcp AAAA target", qname: "_TCP.MQ.shop." + z, qtype: dns.TypeSRV, answer: []string{
			srv("_TCP.MQ.shop."+z, 1883, "i-mq-1.mq.shop")},
			extra: []string{"i-mq-1.mq.shop.edgeplane.internal. 5 IN AAAA fd00::9"}},
		{name: "_tcp ANY", qname: "_tcp.mq.shop." + z, qtype: dns.TypeANY, answer: []string{srv("_tcp.mq.shop."+z, 1883, "i-mq-1.mq.shop")}},
		{name: "_tcp A is NODATA", qname: "_tcp.db.shop." + z, qtype: dns.TypeA},
		{name: "_udp of a tcp-only service is NXDOMAIN", qname: "_udp.mq.shop." + z, qtype: dns.TypeSRV, rcode: dns.RcodeNameError},
		{name: "_udp without routable instances is NODATA", qname: "_udp.dns.shop." + z, qtype: dns.TypeSRV},
		// _tcp.<service> is the parent of _http._tcp.<service>: an empty
		// non-terminal for every service.
		{name: "_tcp of a udp-only service is NODATA", qname: "_tcp.dns.shop." + z, qtype: dns.TypeSRV},
		{name: "_tcp of an HTTP service stays an empty non-terminal", qname: "_tcp.web.shop." + z, qtype: dns.TypeSRV},
		{name: "_udp of an HTTP service is NXDOMAIN", qname: "_udp.web.shop." + z, qtype: dns.TypeSRV, rcode: dns.RcodeNameError},
		{name: "passthrough alone adds no _tcp records", qname: "_tcp.tls.shop." + z, qtype: dns.TypeSRV},
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				r := ask(t, proto, addr, query(tc.qname, tc.qtype))
				if r.Rcode != tc.rcode {
					t.Fatalf("rcode %s, want %s\n%s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode], r)
				}
				if !r.Authoritative {
					t.Errorf("AA not set")
				}
				if len(tc.answer) == 0 && !slices.Equal(rrStrings(r.Ns), []string{soaLine}) {
					t.Errorf("authority %q, want the SOA", rrStrings(r.Ns))
				}
				for _, c := range []struct {
					section   string
					got, want []string
				}{{"answer", rrStrings(r.Answer), tc.answer}, {"additional", rrStrings(r.Extra), tc.extra}} {
					w := slices.Clone(c.want)
					slices.Sort(w)
					if !slices.Equal(c.got, w) {
						t.Errorf("%s:\n got %q\nwant %q", c.section, c.got, w)
					}
				}
			})
		}
	}
}

// During a canary the layer-4 SRV names split as the service's name
// does: each side's weights add up to its share.
func TestZoneLayer4CanaryWeights(t *testing.T) {
	db := l4svc("shop", "db", store.Layer4{TCP: []store.L4Port{{Port: 5432}}},
		ep("i-old-1", 0, "10.100.0.5", 5432), ep("i-old-2", 1, "10.100.0.6", 5432),
		store.Endpoint{InstanceID: "i-new-1", Machine: "m1", Slot: 0, Revision: 2, Address: "10.100.0.7", Port: 5432})
	db.Split = &store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 10}
	src := &memSource{}
	src.set(&memView{services: []*projection.Service{db}}, 1)
	_, addr := startServer(t, Config{}, src)
	const name = "_tcp.db.shop.edgeplane.internal."
	if _, got := answers(t, "udp", addr, name, dns.TypeSRV); !slices.Equal(got, []string{
		name + " 5 IN SRV 0 1000 5432 i-new-1.db.shop.edgeplane.internal.",
		name + " 5 IN SRV 0 4500 5432 i-old-1.db.shop.edgeplane.internal.",
		name + " 5 IN SRV 0 4500 5432 i-old-2.db.shop.edgeplane.internal.",
	}) {
		t.Fatalf("SRV at 10%%: %q", got)
	}
}

// TestLayer4OverNATS: a real projection fed by a real embedded NATS
// answers _tcp and _udp from the service's routing upserts, follows a
// redeploy to new instances, and drops the names a redeploy stops
// exposing.
func TestLayer4OverNATS(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	p, err := projection.New(projection.Config{Store: srv.Store})
	if err != nil {
		t.Fatal(err)
	}
	runProjection(t, p)
	_, addr := startServer(t, Config{}, ProjectionSource(p))
	deploy := func(l4 store.Layer4, ids ...string) {
		t.Helper()
		var insts []storetest.Instance
		for i, id := range ids {
			insts = append(insts, storetest.Instance{ID: id, Machine: "m" + strconv.Itoa(i+1), Address: "10.100.0." + strconv.Itoa(5+i), Port: 6379})
		}
		pend, err := storetest.Prepare(ctx, srv.Store, "shop", map[string]storetest.Service{"cache": {Instances: insts}})
		if err != nil {
			t.Fatal(err)
		}
		spec := pend.Deploy.Manifest.Services["cache"]
		spec.Layer4 = l4
		pend.Deploy.Manifest.Services["cache"] = spec
		seq, err := pend.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitSeq(t, p, seq)
	}
	const tcpName, udpName = "_tcp.cache.shop.edgeplane.internal.", "_udp.cache.shop.edgeplane.internal."

	deploy(store.Layer4{TCP: []store.L4Port{{Port: 6379}}, UDP: []store.L4Port{{Port: 6379}}}, "cache-a", "cache-b")
	for _, proto := range []string{"udp", "tcp"} {
		for _, name := range []string{tcpName, udpName} {
			if _, got := answers(t, proto, addr, name, dns.TypeSRV); !slices.Equal(got, []string{
				name + " 5 IN SRV 0 10 6379 cache-a.cache.shop.edgeplane.internal.",
				name + " 5 IN SRV 0 10 6379 cache-b.cache.shop.edgeplane.internal."}) {
				t.Fatalf("%s %s after deploy: %q", proto, name, got)
			}
		}
	}

	// A redeploy to new instances, tcp only: _tcp follows, _udp is gone.
	deploy(store.Layer4{TCP: []store.L4Port{{Port: 6379}}}, "cache-c")
	if _, got := answers(t, "udp", addr, tcpName, dns.TypeSRV); !slices.Equal(got, []string{
		tcpName + " 5 IN SRV 0 10 6379 cache-c.cache.shop.edgeplane.internal."}) {
		t.Fatalf("_tcp after redeploy: %q", got)
	}
	if rc, got := answers(t, "udp", addr, udpName, dns.TypeSRV); rc != dns.RcodeNameError {
		t.Fatalf("_udp after a redeploy without udp: %s %q", dns.RcodeToString[rc], got)
	}

	// Nothing below HTTP any more: _tcp is an empty non-terminal again.
	deploy(store.Layer4{}, "cache-c")
	if rc, got := answers(t, "udp", addr, tcpName, dns.TypeSRV); rc != dns.RcodeSuccess || len(got) != 0 {
		t.Fatalf("_tcp after a redeploy without tcp: %s %q", dns.RcodeToString[rc], got)
	}
}

// TestLayer4Locality: from real views over machines in three regions,
// _tcp and _udp answer in the tiers _http._tcp does (the resolver's
// region first, a disabled region never, strict: home only), so a client
// that follows them falls over in the gateway's order.
func TestLayer4Locality(t *testing.T) {
	const name = "db.shop.edgeplane.internal."
	for _, c := range []struct {
		region string
		loc    *store.Locality
		states map[string]string
		want   []string
	}{
		{"tyo", nil, nil, []string{"0 db-tyo-1", "0 db-tyo-2", "1 db-fra-1", "1 db-fra-2", "2 db-nyc-1", "2 db-nyc-2"}},
		{"tyo", nil, map[string]string{"fra": store.RegionDisabled}, []string{"0 db-tyo-1", "0 db-tyo-2", "1 db-nyc-1", "1 db-nyc-2"}},
		{"nyc", &store.Locality{Policy: store.LocalityStrict}, nil, []string{"0 db-nyc-1", "0 db-nyc-2"}},
	} {
		ev := spread("db", c.loc)
		ev.Layer4 = store.Layer4{TCP: []store.L4Port{{Port: 5432}}, UDP: []store.L4Port{{Port: 5432}}}
		src := &swapSource{}
		src.v.Store(regionView(t, 1, c.states, ev))
		_, addr := startServer(t, Config{Region: c.region}, src)
		for _, owner := range []string{"_http._tcp.", "_tcp.", "_udp."} {
			r := ask(t, "udp", addr, query(owner+name, dns.TypeSRV))
			if got := srvSummary(r.Answer); r.Rcode != dns.RcodeSuccess || !slices.Equal(got, c.want) {
				t.Errorf("%s resolver, states %v: %s SRV %s %v, want %v", c.region, c.states, owner, dns.RcodeToString[r.Rcode], got, c.want)
			}
		}
	}
}
