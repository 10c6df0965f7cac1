package deploy

import (
	"testing"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

func machine(id, region string, labels map[string]string, state string) store.MachineRecord {
	return store.MachineRecord{ID: id, Region: region, Labels: labels, State: state, Address: "127.0.0.1"}
}

func cands(ms ...store.MachineRecord) []*candidate {
	var out []*candidate
	for _, m := range ms {
		out = append(out, &candidate{rec: m, free: 10, perService: map[string]int{}})
	}
	return out
}

func TestPlacementHonoursRegionsLabelsAndState(t *testing.T) {
	three := 3
	m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"x"}, Replicas: &three, Placement: store.Placement{Regions: []string{"eu"}, Labels: map[string]string{"tier": "edge"}}},
	}}
	p := buildPlan(m, nil, nil, nil)
	err := place(p, cands(
		machine("a", "eu", map[string]string{"tier": "edge"}, store.MachineActive),
		machine("b", "eu", map[string]string{"tier": "edge"}, store.MachineActive),
		machine("c", "us", map[string]string{"tier": "edge"}, store.MachineActive),
		machine("d", "eu", nil, store.MachineActive),
		machine("e", "eu", map[string]string{"tier": "edge"}, store.MachineDraining),
		machine("f", "eu", map[string]string{"tier": "edge"}, store.MachineDisabled),
	))
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, a := range p.Actions {
		per[a.Machine]++
	}
	if per["a"]+per["b"] != 3 || per["a"] == 0 || per["b"] == 0 || len(per) != 2 {
		t.Fatalf("placement %v: want 3 slots spread over a and b only", per)
	}
}

func TestPlacementFailsWithoutCapacity(t *testing.T) {
	m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"x"}, Placement: store.Placement{Regions: []string{"ap"}}},
	}}
	p := buildPlan(m, nil, nil, nil)
	err := place(p, cands(machine("a", "eu", nil, store.MachineActive)))
	if se := store.AsError(err); se == nil || se.Code != store.CodeUnavailable || se.Detail["regions"] != "ap" {
		t.Fatalf("got %v", err)
	}
	full := cands(machine("a", "ap", nil, store.MachineActive))
	full[0].free = 0
	if err := place(buildPlan(m, nil, nil, nil), full); err == nil {
		t.Fatal("a full machine took a slot")
	}
}

func TestPlanKeepsUnchangedAndStopsTheRest(t *testing.T) {
	two := 2
	spec := store.ServiceSpec{Command: []string{"x"}, Replicas: &two}
	m := &store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": spec}}
	hash := manifest.SpecHash(spec)
	live := &store.DeployCommit{ID: "d1", Namespace: "ns", Revision: 1, Slots: []store.SlotAssignment{
		{Service: "web", Slot: 0, InstanceID: "w0", Machine: "a", Revision: 1, SpecHash: hash},
		{Service: "web", Slot: 1, InstanceID: "w1", Machine: "b", Revision: 1, SpecHash: hash},
		{Service: "gone", Slot: 0, InstanceID: "g0", Machine: "a", Revision: 1, SpecHash: "x"},
	}}
	ready := func(id, mach string) *store.InstanceRecord {
		return &store.InstanceRecord{ID: id, Namespace: "ns", Machine: mach, Revision: 1, State: store.InstanceReady, Address: "127.0.0.1", Port: 1}
	}
	insts := map[string]*store.InstanceRecord{
		"w0": ready("w0", "a"), "w1": ready("w1", "b"), "g0": ready("g0", "a"),
		"orphan": {ID: "orphan", Namespace: "ns", Service: "web", Machine: "a", State: store.InstanceStarting},
	}
	insts["w0"].Service, insts["w1"].Service, insts["g0"].Service = "web", "web", "gone"
	insts["w1"].Error, insts["w1"].Slot = "crashed", 1
	machines := map[string]store.MachineRecord{"a": machine("a", "", nil, store.MachineActive), "b": machine("b", "", nil, store.MachineActive)}
	p := buildPlan(m, live, insts, machines)
	got := map[string]string{}
	for _, a := range p.Actions {
		got[a.Action+"/"+a.InstanceID+"/"+a.Reason] = a.Service
	}
	for _, want := range []string{"keep/w0/unchanged", "start//instance not routable", "stop/w1/replaced", "stop/g0/service removed", "stop/orphan/not in the new commit"} {
		if _, ok := got[want]; !ok {
			t.Errorf("plan lacks %s: %v", want, got)
		}
	}
	if p.Revision != 2 {
		t.Fatalf("revision %d", p.Revision)
	}
}

// Scaling down or changing routes keeps the slots that stay, also when the
// live commit's slots carry a hash an older release computed over the
// whole spec (replicas and routes included).
func TestPlanKeepsSlotsWhenOnlyReplicasOrRoutesChange(t *testing.T) {
	two, one := 2, 1
	liveSpec := store.ServiceSpec{Command: []string{"x"}, Replicas: &two, Routes: []store.Route{{Hosts: []string{"a.example.com"}}}}
	ready := func(id string, slot int) *store.InstanceRecord {
		return &store.InstanceRecord{ID: id, Namespace: "ns", Service: "web", Slot: slot, Machine: "a", Revision: 1,
			State: store.InstanceReady, Address: "127.0.0.1", Port: 1}
	}
	machines := map[string]store.MachineRecord{"a": machine("a", "", nil, store.MachineActive)}
	for name, slotHash := range map[string]string{"current hash": manifest.SpecHash(liveSpec), "older release's hash": "0123456789abcdef"} {
		t.Run(name, func(t *testing.T) {
			live := &store.DeployCommit{ID: "d1", Namespace: "ns", Revision: 1,
				Manifest: store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": liveSpec}},
				Slots: []store.SlotAssignment{
					{Service: "web", Slot: 0, InstanceID: "w0", Machine: "a", Revision: 1, SpecHash: slotHash},
					{Service: "web", Slot: 1, InstanceID: "w1", Machine: "a", Revision: 1, SpecHash: slotHash},
				}}
			insts := map[string]*store.InstanceRecord{"w0": ready("w0", 0), "w1": ready("w1", 1)}

			scaled := liveSpec
			scaled.Replicas = &one
			scaled.Routes = []store.Route{{Hosts: []string{"a.example.com", "b.example.com"}}}
			p := buildPlan(&store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": scaled}}, live, insts, machines)
			if start, keep, stop := p.Counts(); start != 0 || keep != 1 || stop != 1 {
				t.Fatalf("scale 2→1 with a new host: %d to start, %d to keep, %d to stop, want 0/1/1: %+v", start, keep, stop, p.Actions)
			}
			for _, a := range p.Actions {
				if a.Action == ActionKeep && a.InstanceID != "w0" || a.Action == ActionStop && (a.InstanceID != "w1" || a.Reason != "slot removed") {
					t.Errorf("unexpected action %+v", a)
				}
			}

			changed := scaled
			changed.Env = map[string]string{"V": "2"}
			p = buildPlan(&store.Manifest{Namespace: "ns", Services: map[string]store.ServiceSpec{"web": changed}}, live, insts, machines)
			if start, keep, _ := p.Counts(); start != 1 || keep != 0 {
				t.Fatalf("a changed environment kept an instance: %+v", p.Actions)
			}
		})
	}
}
