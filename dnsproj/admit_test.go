package dnsproj

import (
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// viewSource serves one projection view.
type viewSource struct{ v *projection.View }

func (s viewSource) Current() (View, uint64, bool) { return s.v, s.v.Seq, false }

// DNS answers an instance only at its machine's admitted address: a
// signed upsert whose endpoints name loopback, link-local, unspecified or
// multicast addresses, or another machine's, gets none of those into the
// zone (the projection sets them aside); the single box on 127.0.0.1 is
// answered at 127.0.0.1.
func TestZoneAnswersAdmittedAddressesOnly(t *testing.T) {
	machines := []store.MachineRecord{
		{Version: 1, ID: "m1", State: store.MachineActive, Address: "10.100.0.1"},
		{Version: 1, ID: "m2", State: store.MachineActive, Address: "10.100.0.2"},
		{Version: 1, ID: "box", State: store.MachineActive, Address: "127.0.0.1"},
	}
	for _, tc := range []struct {
		id, machine, addr string
		answered          bool // (at an IPv4 address)
	}{
		{"own", "m1", "10.100.0.1", true},
		{"single-box", "box", "127.0.0.1", true},
		{"loopback", "m1", "127.0.0.1", false},
		{"other-loopback-on-box", "box", "127.0.0.2", false},
		{"loopback-v6", "m1", "::1", false},
		{"metadata", "m1", "169.254.169.254", false},
		{"link-local-v6", "m1", "fe80::1", false},
		{"unspecified", "m1", "0.0.0.0", false},
		{"multicast", "m1", "224.0.0.1", false},
		{"multicast-v6", "m1", "ff02::1", false},
		{"another-machines", "m1", "10.100.0.2", false},
		{"unknown-machine", "m9", "10.100.0.9", false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			ev := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web", DeployID: "d1", Revision: 1,
				Endpoints: []store.Endpoint{
					{InstanceID: "real", Machine: "m2", Slot: 0, Revision: 1, Address: "10.100.0.2", Port: 8080},
					{InstanceID: tc.id, Machine: tc.machine, Slot: 1, Revision: 1, Address: tc.addr, Port: 8080},
				}}
			v, _ := projection.FromState(&store.RoutingState{Seq: 1, Services: []store.RoutingEvent{ev}, Machines: machines})
			_, addr := startServer(t, Config{}, viewSource{v})
			const name = "web.shop.edgeplane.internal."
			want := []string{name + " 5 IN A 10.100.0.2"}
			if tc.answered {
				want = append(want, name+" 5 IN A "+tc.addr)
				slices.Sort(want)
			}
			_, a := answers(t, "udp", addr, name, dns.TypeA)
			_, aaaa := answers(t, "udp", addr, name, dns.TypeAAAA)
			if got := append(a, aaaa...); !slices.Equal(got, want) {
				t.Fatalf("answers %q, want %q", got, want)
			}
			rc, _ := answers(t, "udp", addr, tc.id+"."+name, dns.TypeA)
			if tc.answered != (rc == dns.RcodeSuccess) {
				t.Fatalf("the instance's own name: %s", dns.RcodeToString[rc])
			}
		})
	}
}
