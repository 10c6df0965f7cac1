package projection

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// regionView builds a view of one service "web" with two endpoints in each
// of the regions tyo, fra and nyc, and one on a machine without a region,
// with the region states given.
func regionView(t *testing.T, loc *store.Locality, states map[string]string) (*View, *Service) {
	t.Helper()
	b := newBuilder(emptyView(false))
	var eps []store.Endpoint
	for i, r := range []string{"tyo", "fra", "nyc", "tyo", "fra", "nyc", ""} {
		id := fmt.Sprintf("m%d", i)
		addr := fmt.Sprintf("10.100.0.%d", i+1)
		b.upsertMachine(store.MachineRecord{ID: id, Region: r, State: store.MachineActive, Address: addr})
		eps = append(eps, store.Endpoint{InstanceID: fmt.Sprintf("web-%d", i), Machine: id, Slot: i, Address: addr, Port: 8000})
	}
	ev := &store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "ns", Service: "web", Endpoints: eps, Locality: loc}
	evs := []*store.RoutingEvent{ev}
	for name, st := range states {
		evs = append(evs, &store.RoutingEvent{Version: 1, Kind: store.EventRegionUpsert, Region: &store.RegionRecord{Name: name, State: st}})
	}
	for i, ev := range evs {
		if err := b.apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	v := b.finish(uint64(len(evs)), false)
	svc, ok := v.Service("ns", "web")
	if !ok {
		t.Fatal("no service")
	}
	return v, svc
}

func tierRegions(ts []Tier) []string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s:%s%v", t.Region, t.State, t.Endpoints))
	}
	return out
}

func TestTiers(t *testing.T) {
	cases := []struct {
		name    string
		loc     *store.Locality
		states  map[string]string
		home    string
		nearest []string
		want    []string
	}{
		{"prefer: home, then nearest, then by name, unnamed last", nil, nil, "tyo", []string{"nyc"},
			[]string{"tyo:active[0 3]", "nyc:active[2 5]", "fra:active[1 4]", ":active[6]"}},
		{"prefer: the service's order before the measured one", &store.Locality{Order: []string{"fra"}}, nil, "tyo", []string{"nyc"},
			[]string{"tyo:active[0 3]", "fra:active[1 4]", "nyc:active[2 5]", ":active[6]"}},
		{"prefer: draining home after every active region, disabled never", nil,
			map[string]string{"tyo": store.RegionDraining, "fra": store.RegionDisabled}, "tyo", nil,
			[]string{"nyc:active[2 5]", ":active[6]", "tyo:draining[0 3]"}},
		{"strict: home only", &store.Locality{Policy: store.LocalityStrict}, nil, "fra", nil,
			[]string{"fra:active[1 4]"}},
		{"strict: a disabled home has nothing", &store.Locality{Policy: store.LocalityStrict},
			map[string]string{"fra": store.RegionDisabled}, "fra", nil, nil},
		{"strict: a draining home still serves", &store.Locality{Policy: store.LocalityStrict},
			map[string]string{"fra": store.RegionDraining}, "fra", nil, []string{"fra:draining[1 4]"}},
		{"any: one active tier, then draining", &store.Locality{Policy: store.LocalityAny},
			map[string]string{"nyc": store.RegionDraining}, "tyo", nil,
			[]string{":active[0 1 3 4 6]", ":draining[2 5]"}},
		{"prefer without a home region is any", nil, map[string]string{"nyc": store.RegionDisabled}, "", nil,
			[]string{":active[0 1 3 4 6]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, svc := regionView(t, c.loc, c.states)
			if got := tierRegions(v.Tiers(svc, c.home, c.nearest)); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Tiers(%q) = %v, want %v", c.home, got, c.want)
			}
		})
	}
}

func TestRegionStatesSurviveASnapshot(t *testing.T) {
	v, _ := regionView(t, nil, map[string]string{"fra": store.RegionDraining})
	path := t.TempDir() + "/snap.json"
	if err := writeSnapshot(path, v); err != nil {
		t.Fatal(err)
	}
	got, err := loadSnapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	if st := got.RegionState("fra"); st != store.RegionDraining {
		t.Errorf("fra after a snapshot: %s, want draining", st)
	}
	if want := []string{"fra", "nyc", "tyo"}; !reflect.DeepEqual(got.KnownRegions(), want) {
		t.Errorf("KnownRegions() = %v, want %v", got.KnownRegions(), want)
	}
	if got.Digest() != v.Digest() {
		t.Error("digest changed through a snapshot")
	}
}

func TestLocal(t *testing.T) {
	v, svc := regionView(t, nil, nil)
	if v.Local(svc, "tyo") {
		t.Error("a service spread over regions is local")
	}
	b := newBuilder(v)
	if err := b.apply(&store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "ns", Service: "one",
		Endpoints: svc.Endpoints[:1]}); err != nil {
		t.Fatal(err)
	}
	v = b.finish(9, false)
	one, _ := v.Service("ns", "one")
	if !v.Local(one, "tyo") || v.Local(one, "fra") {
		t.Error("Local of a service in tyo only")
	}
}

// KnownRegions follows machines joining, moving region and leaving, and
// the regions given a state.
func TestKnownRegionsFollowMachines(t *testing.T) {
	v, _ := regionView(t, nil, map[string]string{"syd": store.RegionDisabled})
	if want := []string{"fra", "nyc", "syd", "tyo"}; !reflect.DeepEqual(v.KnownRegions(), want) {
		t.Fatalf("KnownRegions() = %v, want %v", v.KnownRegions(), want)
	}
	b := newBuilder(v)
	// Both nyc machines go: one leaves, the other moves to fra.
	b.removeMachine("m2")
	b.upsertMachine(store.MachineRecord{ID: "m5", Region: "fra", State: store.MachineActive, Address: "10.100.0.6"})
	b.upsertMachine(store.MachineRecord{ID: "m9", Region: "ams", State: store.MachineActive, Address: "10.100.0.10"})
	next := b.finish(v.Seq+1, false)
	if want := []string{"ams", "fra", "syd", "tyo"}; !reflect.DeepEqual(next.KnownRegions(), want) {
		t.Errorf("after the changes: %v, want %v", next.KnownRegions(), want)
	}
	if want := []string{"fra", "nyc", "syd", "tyo"}; !reflect.DeepEqual(v.KnownRegions(), want) {
		t.Errorf("the base view changed: %v", v.KnownRegions())
	}
}
