package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Readers take an instance's state from its record or its machine's
// observation, whichever is newer; an observation is never taken for an
// instance of another machine or namespace, whatever its body says.
func TestListInstancesTakesNewerObservations(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	t0 := time.Now().UTC().Add(-time.Minute)
	rec := func(id, machine string) *store.InstanceRecord {
		return &store.InstanceRecord{ID: id, Namespace: "ns", Service: "web", Machine: machine, State: store.InstanceStarting,
			Address: "10.0.0.1", Port: 8000, Driver: "process", CreatedAt: t0, UpdatedAt: t0}
	}
	for _, r := range []*store.InstanceRecord{rec("newer", "m1"), rec("older", "m1"), rec("otherns", "m1"), rec("elsewhere", "m2"), rec("unseen", "m1")} {
		if _, err := s.PutInstance(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// The stop is newer than what m1 observed of "older".
	stopped := rec("older", "m1")
	stopped.State, stopped.UpdatedAt = store.InstanceStopped, t0.Add(30*time.Second)
	if _, err := s.PutInstance(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(10 * time.Second)
	obs := func(ns string, state store.InstanceState) store.ObservedInstance {
		return store.ObservedInstance{Namespace: ns, State: state, Restarts: 2, UpdatedAt: later}
	}
	if _, err := s.PutObserved(ctx, &store.MachineObserved{Machine: "m1", Instances: map[string]store.ObservedInstance{
		"newer": obs("ns", store.InstanceReady), "older": obs("ns", store.InstanceReady), "otherns": obs("other", store.InstanceReady),
		// m1 speaking for an instance on m2.
		"elsewhere": obs("ns", store.InstanceFailed),
	}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]store.InstanceState{"newer": store.InstanceReady, "older": store.InstanceStopped, "otherns": store.InstanceStarting,
		"elsewhere": store.InstanceStarting, "unseen": store.InstanceStarting}
	check := func(got map[string]*store.InstanceRecord) {
		t.Helper()
		for id, st := range want {
			if got[id] == nil || got[id].State != st {
				t.Errorf("%s: got %+v, want state %s", id, got[id], st)
			}
		}
		if r := got["newer"]; r != nil && (r.Restarts != 2 || !r.UpdatedAt.Equal(later)) {
			t.Errorf("newer: restarts %d at %s, want the observation's 2 at %s", r.Restarts, r.UpdatedAt, later)
		}
	}
	got, err := s.NamespaceInstances(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	check(got)
	// Many machines' observations are read in batches: the same answer.
	for i := range 40 {
		m := fmt.Sprintf("pad%02d", i)
		if _, err := s.PutInstance(ctx, rec("pad-"+m, m)); err != nil {
			t.Fatal(err)
		}
	}
	got = map[string]*store.InstanceRecord{}
	if err := s.ListInstances(ctx, ">", func(_ string, r *store.InstanceRecord) error {
		got[r.ID] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check(got)
	// An observation filed under another machine's key is not read at
	// all.
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.ObservedBucket()), "m2", &store.MachineObserved{Version: store.RecordVersion, Machine: "m1",
		Instances: map[string]store.ObservedInstance{"elsewhere": obs("ns", store.InstanceReady)}}); err != nil {
		t.Fatal(err)
	}
	got, err = s.NamespaceInstances(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	check(got)
}
