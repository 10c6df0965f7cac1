package dnsproj

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// swapSource serves real projection views that a test swaps.
type swapSource struct {
	v atomic.Pointer[projection.View]
}

func (s *swapSource) Current() (View, uint64, bool) {
	v := s.v.Load()
	return v, v.Seq, v.Stale
}

// regionMachines are two machines in each of tyo, fra and nyc; their
// instance i of a service is at 10.<region>.0.<i>.
var regionMachines = []store.MachineRecord{
	{ID: "tyo-1", Region: "tyo", Address: "10.1.0.1"}, {ID: "tyo-2", Region: "tyo", Address: "10.1.0.2"},
	{ID: "fra-1", Region: "fra", Address: "10.2.0.1"}, {ID: "fra-2", Region: "fra", Address: "10.2.0.2"},
	{ID: "nyc-1", Region: "nyc", Address: "10.3.0.1"}, {ID: "nyc-2", Region: "nyc", Address: "10.3.0.2"},
}

// spread is the upsert of service name with one instance on every machine
// of regionMachines, in their order.
func spread(name string, loc *store.Locality) store.RoutingEvent {
	ev := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop",
		Service: name, DeployID: "shop-d1", Revision: 1, Locality: loc}
	for i, m := range regionMachines {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: name + "-" + m.ID, Machine: m.ID, Slot: i,
			Revision: 1, Address: m.Address, Port: 8000})
	}
	return ev
}

// regionView is the real view of services over regionMachines with the
// region states given.
func regionView(t testing.TB, seq uint64, states map[string]string, services ...store.RoutingEvent) *projection.View {
	t.Helper()
	return machinesView(t, seq, regionMachines, states, services...)
}

// machinesView is the real view of services over machines.
func machinesView(t testing.TB, seq uint64, machines []store.MachineRecord, states map[string]string, services ...store.RoutingEvent) *projection.View {
	t.Helper()
	rs := &store.RoutingState{Seq: seq, Services: services}
	for _, m := range machines {
		m.Version, m.State = store.RecordVersion, store.MachineActive
		rs.Machines = append(rs.Machines, m)
	}
	for name, st := range states {
		rs.Regions = append(rs.Regions, store.RegionRecord{Name: name, State: st})
	}
	v, errs := projection.FromState(rs)
	if len(errs) > 0 {
		t.Fatalf("building the view: %v", errs)
	}
	return v
}

// srvSummary renders SRV records as "priority target-host-label" sorted
// by priority, then target: the order a client tries them in.
func srvSummary(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if s, ok := rr.(*dns.SRV); ok {
			out = append(out, fmt.Sprintf("%d %s", s.Priority, strings.SplitN(s.Target, ".", 2)[0]))
		}
	}
	slices.Sort(out)
	return out
}

func aSummary(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	slices.Sort(out)
	return out
}

// TestLocalityAnswers asks a resolver of each region (and one without) over
// a real socket, from real views, for A and SRV of services under each
// policy and region states.
func TestLocalityAnswers(t *testing.T) {
	const web, only = "web.shop.edgeplane.internal.", "only.shop.edgeplane.internal."
	strict := &store.Locality{Policy: store.LocalityStrict}
	cases := []struct {
		name    string
		region  string
		loc     *store.Locality
		states  map[string]string
		wantA   []string
		wantSRV []string
	}{
		{"tyo answers tyo first, the others by name", "tyo", nil, nil,
			[]string{"10.1.0.1", "10.1.0.2"},
			[]string{"0 web-tyo-1", "0 web-tyo-2", "1 web-fra-1", "1 web-fra-2", "2 web-nyc-1", "2 web-nyc-2"}},
		{"fra answers fra first", "fra", nil, nil,
			[]string{"10.2.0.1", "10.2.0.2"},
			[]string{"0 web-fra-1", "0 web-fra-2", "1 web-nyc-1", "1 web-nyc-2", "2 web-tyo-1", "2 web-tyo-2"}},
		{"the service's order comes before names", "fra", &store.Locality{Order: []string{"tyo"}}, nil,
			[]string{"10.2.0.1", "10.2.0.2"},
			[]string{"0 web-fra-1", "0 web-fra-2", "1 web-tyo-1", "1 web-tyo-2", "2 web-nyc-1", "2 web-nyc-2"}},
		{"a draining home answers after every active region", "tyo", nil, map[string]string{"tyo": store.RegionDraining},
			[]string{"10.2.0.1", "10.2.0.2"},
			[]string{"0 web-fra-1", "0 web-fra-2", "1 web-nyc-1", "1 web-nyc-2", "2 web-tyo-1", "2 web-tyo-2"}},
		{"a disabled region is never answered", "tyo", nil, map[string]string{"fra": store.RegionDisabled},
			[]string{"10.1.0.1", "10.1.0.2"},
			[]string{"0 web-tyo-1", "0 web-tyo-2", "1 web-nyc-1", "1 web-nyc-2"}},
		{"strict: home only", "nyc", strict, nil,
			[]string{"10.3.0.1", "10.3.0.2"},
			[]string{"0 web-nyc-1", "0 web-nyc-2"}},
		{"strict: a disabled home answers nothing", "nyc", strict, map[string]string{"nyc": store.RegionDisabled},
			nil, nil},
		{"any: every active region alike, draining after", "tyo", &store.Locality{Policy: store.LocalityAny},
			map[string]string{"nyc": store.RegionDraining},
			[]string{"10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2"},
			[]string{"0 web-fra-1", "0 web-fra-2", "0 web-tyo-1", "0 web-tyo-2", "1 web-nyc-1", "1 web-nyc-2"}},
		{"no region: every active region alike", "", nil, map[string]string{"fra": store.RegionDraining, "nyc": store.RegionDisabled},
			[]string{"10.1.0.1", "10.1.0.2"},
			[]string{"0 web-tyo-1", "0 web-tyo-2", "1 web-fra-1", "1 web-fra-2"}},
		{"draining regions only when nothing else", "tyo", nil,
			map[string]string{"tyo": store.RegionDisabled, "fra": store.RegionDraining, "nyc": store.RegionDraining},
			[]string{"10.2.0.1", "10.2.0.2"},
			[]string{"0 web-fra-1", "0 web-fra-2", "1 web-nyc-1", "1 web-nyc-2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := &swapSource{}
			src.v.Store(regionView(t, 1, c.states, spread("web", c.loc)))
			_, addr := startServer(t, Config{Region: c.region}, src)
			r := ask(t, "udp", addr, query(web, dns.TypeA))
			if r.Rcode != dns.RcodeSuccess || !slices.Equal(aSummary(r.Answer), c.wantA) {
				t.Errorf("A: %s %v, want %v", dns.RcodeToString[r.Rcode], aSummary(r.Answer), c.wantA)
			}
			if c.wantA == nil && len(r.Ns) == 0 {
				t.Error("NODATA without the SOA")
			}
			r = ask(t, "tcp", addr, query("_http._tcp."+web, dns.TypeSRV))
			if got := srvSummary(r.Answer); r.Rcode != dns.RcodeSuccess || !slices.Equal(got, c.wantSRV) {
				t.Errorf("SRV: %s %v, want %v", dns.RcodeToString[r.Rcode], got, c.wantSRV)
			}
			// An instance has a name while some tier answers it.
			for _, m := range regionMachines {
				name := "web-" + m.ID + ".web.shop.edgeplane.internal."
				want := dns.RcodeNameError
				if slices.ContainsFunc(c.wantSRV, func(s string) bool { return strings.HasSuffix(s, " web-"+m.ID) }) {
					want = dns.RcodeSuccess
				}
				if rc := ask(t, "udp", addr, query(name, dns.TypeA)).Rcode; rc != want {
					t.Errorf("%s: %s, want %s", name, dns.RcodeToString[rc], dns.RcodeToString[want])
				}
			}
		})
	}
	// A service in one region only is answered from there by every
	// region's resolver.
	src := &swapSource{}
	one := spread("only", nil)
	one.Endpoints = one.Endpoints[2:4] // fra's
	src.v.Store(regionView(t, 1, nil, one))
	for _, region := range []string{"tyo", "fra", ""} {
		_, addr := startServer(t, Config{Region: region}, src)
		if got := aSummary(ask(t, "udp", addr, query(only, dns.TypeA)).Answer); !slices.Equal(got, []string{"10.2.0.1", "10.2.0.2"}) {
			t.Errorf("%q resolver: A %v", region, got)
		}
	}
}

// TestLocalityCanaryWithinTier: a canary's weights are shared within the
// tier, so each tier's SRV weights add up to the same split.
func TestLocalityCanaryWithinTier(t *testing.T) {
	ev := spread("web", nil)
	for i := range ev.Endpoints {
		if i%2 == 1 { // the second machine of each region runs the canary
			ev.Endpoints[i].Revision = 2
		}
	}
	ev.Split = &store.Split{Deploy: "shop-d2", Revision: 2, From: 1, Weight: 20}
	src := &swapSource{}
	src.v.Store(regionView(t, 1, nil, ev))
	_, addr := startServer(t, Config{Region: "tyo"}, src)
	r := ask(t, "tcp", addr, query("web.shop.edgeplane.internal.", dns.TypeSRV))
	byPriority := map[uint16]map[uint16]int{}
	for _, rr := range r.Answer {
		s := rr.(*dns.SRV)
		if byPriority[s.Priority] == nil {
			byPriority[s.Priority] = map[uint16]int{}
		}
		byPriority[s.Priority][s.Weight]++
	}
	for p := uint16(0); p < 3; p++ {
		if w := byPriority[p]; w[8000] != 1 || w[2000] != 1 || len(w) != 2 {
			t.Errorf("priority %d weights %v, want one of 8000 and one of 2000", p, w)
		}
	}
}

// TestLocalityRegionStateSwapsAnswers: a region state arrives with a new
// view, and the very next answer follows it (the zone is indexed per view;
// no cache holds zone answers).
func TestLocalityRegionStateSwapsAnswers(t *testing.T) {
	src := &swapSource{}
	src.v.Store(regionView(t, 1, nil, spread("web", nil)))
	_, addr := startServer(t, Config{Region: "tyo"}, src)
	const web = "web.shop.edgeplane.internal."
	for i, step := range []struct {
		states map[string]string
		want   []string
	}{
		{nil, []string{"10.1.0.1", "10.1.0.2"}},
		{map[string]string{"tyo": store.RegionDraining}, []string{"10.2.0.1", "10.2.0.2"}},
		{map[string]string{"tyo": store.RegionDraining, "fra": store.RegionDisabled}, []string{"10.3.0.1", "10.3.0.2"}},
		{map[string]string{"tyo": store.RegionActive, "fra": store.RegionDisabled}, []string{"10.1.0.1", "10.1.0.2"}},
	} {
		src.v.Store(regionView(t, uint64(i+1), step.states, spread("web", nil)))
		if got := aSummary(ask(t, "udp", addr, query(web, dns.TypeA)).Answer); !slices.Equal(got, step.want) {
			t.Errorf("states %v: A %v, want %v", step.states, got, step.want)
		}
	}
}

// TestRegionNotADNSLabel: a server's region must be a DNS label.
func TestRegionNotADNSLabel(t *testing.T) {
	for _, bad := range []string{"eu west", "eu.west", "EU", "eu_west", "-eu", strings.Repeat("a", 64), "tōkyō"} {
		_, err := New(Config{Region: bad}, &memSource{v: &memView{}})
		if err == nil || !strings.Contains(err.Error(), "not a DNS label") || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("region %q: %v", bad, err)
		}
	}
	if _, err := New(Config{Region: "eu-west-1"}, &memSource{v: &memView{}}); err != nil {
		t.Errorf("region eu-west-1: %v", err)
	}
}

// TestRegionForFollowsTheView: a server given RegionFor (beside a gateway
// whose region follows its machine's record) answers each view as a
// reader in the region RegionFor names for it; a configured Region wins.
func TestRegionForFollowsTheView(t *testing.T) {
	machineRegion := func(v View) string {
		m, _ := v.(*projection.View).Machine("fra-1")
		return m.Region
	}
	src := &swapSource{}
	src.v.Store(regionView(t, 1, nil, spread("web", nil)))
	_, addr := startServer(t, Config{RegionFor: machineRegion}, src)
	_, fixed := startServer(t, Config{Region: "nyc", RegionFor: machineRegion}, src)
	const web = "web.shop.edgeplane.internal."
	if got := aSummary(ask(t, "udp", addr, query(web, dns.TypeA)).Answer); !slices.Equal(got, []string{"10.2.0.1", "10.2.0.2"}) {
		t.Errorf("fra-1 in fra: A %v", got)
	}
	// fra-1's record moves it to tyo: the next view is answered from tyo.
	moved := slices.Clone(regionMachines)
	moved[2].Region = "tyo"
	src.v.Store(machinesView(t, 2, moved, nil, spread("web", nil)))
	if got := aSummary(ask(t, "udp", addr, query(web, dns.TypeA)).Answer); !slices.Equal(got, []string{"10.1.0.1", "10.1.0.2", "10.2.0.1"}) {
		t.Errorf("fra-1 in tyo: A %v", got)
	}
	if got := aSummary(ask(t, "udp", fixed, query(web, dns.TypeA)).Answer); !slices.Equal(got, []string{"10.3.0.1", "10.3.0.2"}) {
		t.Errorf("configured nyc: A %v", got)
	}
}

// TestNearestOrdersTheFallback: a server given Nearest (the gateway beside
// it measures the round trips) falls back in that order, and answers
// anew in the very next query when the order changes, the view the same.
func TestNearestOrdersTheFallback(t *testing.T) {
	type order struct {
		regions []string
		version uint64
	}
	var cur atomic.Pointer[order]
	cur.Store(&order{})
	src := &swapSource{}
	src.v.Store(regionView(t, 1, nil, spread("web", nil)))
	_, addr := startServer(t, Config{Region: "tyo", Nearest: func() ([]string, uint64) {
		o := cur.Load()
		return o.regions, o.version
	}}, src)
	const web = "web.shop.edgeplane.internal."
	for _, c := range []struct {
		nearest []string
		want    []string
	}{
		{nil, []string{"0 web-tyo-1", "0 web-tyo-2", "1 web-fra-1", "1 web-fra-2", "2 web-nyc-1", "2 web-nyc-2"}},
		{[]string{"nyc", "fra"}, []string{"0 web-tyo-1", "0 web-tyo-2", "1 web-nyc-1", "1 web-nyc-2", "2 web-fra-1", "2 web-fra-2"}},
		{[]string{"fra", "nyc"}, []string{"0 web-tyo-1", "0 web-tyo-2", "1 web-fra-1", "1 web-fra-2", "2 web-nyc-1", "2 web-nyc-2"}},
	} {
		cur.Store(&order{regions: c.nearest, version: cur.Load().version + 1})
		r := ask(t, "tcp", addr, query("_http._tcp."+web, dns.TypeSRV))
		if got := srvSummary(r.Answer); !slices.Equal(got, c.want) {
			t.Errorf("nearest %v: SRV %v, want %v", c.nearest, got, c.want)
		}
	}
}
