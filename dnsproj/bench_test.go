package dnsproj

import (
	"testing"

	"github.com/miekg/dns"
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
