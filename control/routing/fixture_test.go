package routing_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The deploys the tests of the projection, the gateway and DNS write
// through storetest publish what the control plane would: storetest.Events
// writes the rule out again (it sits below the control plane), and is held
// here to CommitEvents over instances of every kind the rule tells apart.
func TestFixtureEventsAreTheControlPlanes(t *testing.T) {
	slot := func(service string, i int, id, machine string, rev int64) store.SlotAssignment {
		return store.SlotAssignment{Service: service, Slot: i, InstanceID: id, Machine: machine, Revision: rev}
	}
	prev := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}, "gone": {}, "old": {}}}}
	c := &store.DeployCommit{ID: "d2", Namespace: "shop", Kind: store.CommitFinal, Revision: 2,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{
			"web": {Routes: []store.Route{{Hosts: []string{"shop.example"}}}, Readiness: store.Readiness{Path: "/ready"},
				Locality: &store.Locality{Policy: store.LocalityPrefer, Order: []string{"fra", "ams"}}, SlowStart: store.Duration(30 * time.Second)},
			"api": {},
		}},
		Slots: []store.SlotAssignment{
			slot("web", 0, "ready", "m1", 2),
			slot("web", 1, "draining", "m1", 2),
			slot("web", 2, "failed", "m1", 2),
			slot("web", 3, "no-port", "m1", 2),
			slot("web", 4, "port-past-65535", "m1", 2),
			slot("web", 5, "older-revision", "m1", 2),
			slot("web", 6, "other-machine", "m1", 2),
			slot("web", 7, "machine-unknown", "m3", 2),
			slot("web", 8, "machine-without-address", "m2", 2),
			slot("web", 9, "no-record", "m1", 2),
			slot("api", 0, "api-ready", "m1", 2),
		}}
	inst := func(id, machine string, rev int64, state store.InstanceState, port int, errText string) *store.InstanceRecord {
		return &store.InstanceRecord{ID: id, Namespace: "shop", Service: "web", Revision: rev, Machine: machine,
			Address: "203.0.113.9", Port: port, State: state, Error: errText}
	}
	insts := map[string]*store.InstanceRecord{}
	for _, in := range []*store.InstanceRecord{
		inst("ready", "m1", 2, store.InstanceReady, 9001, ""),
		inst("draining", "m1", 2, store.InstanceDraining, 9002, ""),
		inst("failed", "m1", 2, store.InstanceReady, 9003, "exit status 1"),
		inst("no-port", "m1", 2, store.InstanceReady, 0, ""),
		inst("port-past-65535", "m1", 2, store.InstanceReady, 70000, ""),
		inst("older-revision", "m1", 1, store.InstanceReady, 9005, ""),
		inst("other-machine", "m2", 2, store.InstanceReady, 9006, ""),
		inst("machine-unknown", "m3", 2, store.InstanceReady, 9007, ""),
		inst("machine-without-address", "m2", 2, store.InstanceReady, 9008, ""),
		inst("api-ready", "m1", 2, store.InstanceReady, 9009, ""),
	} {
		insts[in.ID] = in
	}
	machines := map[string]*store.MachineRecord{
		"m1": {ID: "m1", Address: "10.0.0.1"},
		"m2": {ID: "m2"},
	}
	for _, prev := range []*store.DeployCommit{nil, prev} {
		want := routing.CommitEvents(c, prev, &routing.Source{Instances: insts, Machines: machines})
		got := storetest.Events(c, prev, insts, machines)
		for _, evs := range [][]store.RoutingEvent{want, got} {
			for i := range evs {
				evs[i].At = time.Time{}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("after %v: storetest.Events differs from the control plane's:\n got %+v\nwant %+v", prev != nil, got, want)
		}
		if len(want) == 0 || len(want[0].Endpoints) != 1 || len(want[1].Endpoints) != 1 {
			t.Fatalf("the cases route one endpoint of api and one of web: %+v", want)
		}
	}
}
