package dnsproj

import (
	"fmt"
	"testing"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// BenchmarkServeDNS measures the in-process query path (handler, zone
// lookup, packing) for a zone A answer, an NXDOMAIN and a mixed-case name;
// bench/bench.sh measures whole servers against CoreDNS.
func BenchmarkServeDNS(b *testing.B) {
	src := &memSource{}
	src.set(bigView(3), 1)
	s, err := New(Config{}, src)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []struct{ name, qname string }{
		{"A", "big.shop.edgeplane.internal."},
		{"NXDOMAIN", "missing.shop.edgeplane.internal."},
		{"MixedCase", "BIG.shop.edgeplane.internal."},
	} {
		b.Run(q.name, func(b *testing.B) {
			data, err := query(q.qname, dns.TypeA).Pack()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if out := serveBytes(s, data, false); len(out) != 1 {
					b.Fatal("no reply")
				}
			}
		})
	}
}

// rebuildSource hands out one of two views with the same content in turn,
// so that every query finds a new view and rebuilds the zone's index: the
// work a routing change costs the zone.
type rebuildSource struct {
	views [2]*projection.View
	n     int
}

func (s *rebuildSource) Current() (View, uint64, bool) {
	s.n++
	v := s.views[s.n%2]
	return v, v.Seq, false
}

// rebuildState is 500 services of 3 instances each over 6 machines, in
// the regions given (one per machine; "" for none).
func rebuildState(regions [6]string) *store.RoutingState {
	rs := &store.RoutingState{Seq: 1}
	for i, r := range regions {
		rs.Machines = append(rs.Machines, store.MachineRecord{Version: store.RecordVersion, ID: fmt.Sprintf("m%d", i),
			Region: r, State: store.MachineActive, Address: fmt.Sprintf("10.100.0.%d", i+1)})
	}
	for s := 0; s < 500; s++ {
		ev := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop",
			Service: fmt.Sprintf("svc%d", s), DeployID: "d1", Revision: 1}
		for k := 0; k < 3; k++ {
			m := (s + k*2) % 6
			ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: fmt.Sprintf("svc%d-%d", s, k), Machine: fmt.Sprintf("m%d", m),
				Slot: k, Revision: 1, Address: fmt.Sprintf("10.100.0.%d", m+1), Port: 8000 + k})
		}
		rs.Services = append(rs.Services, ev)
	}
	return rs
}

// BenchmarkZoneRebuild measures building the zone of a new view (500
// services, 1500 instances) and answering one query from it: without
// regions (the path every cluster without regions takes), and with
// machines in three regions answered by a server in one of them.
func BenchmarkZoneRebuild(b *testing.B) {
	for _, c := range []struct {
		name    string
		regions [6]string
		region  string
	}{
		{"NoRegions", [6]string{}, ""},
		{"ThreeRegions", [6]string{"tyo", "fra", "nyc", "tyo", "fra", "nyc"}, "tyo"},
	} {
		b.Run(c.name, func(b *testing.B) {
			src := &rebuildSource{}
			for i := range src.views {
				v, errs := projection.FromState(rebuildState(c.regions))
				if len(errs) > 0 {
					b.Fatal(errs)
				}
				src.views[i] = v
			}
			s, err := New(Config{Region: c.region}, src)
			if err != nil {
				b.Fatal(err)
			}
			data, err := query("svc7.shop.edgeplane.internal.", dns.TypeA).Pack()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if out := serveBytes(s, data, false); len(out) != 1 {
					b.Fatal("no reply")
				}
			}
		})
	}
}
