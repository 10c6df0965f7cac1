package store_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// referenceLoad reads routing state the plain way, a few requests per
// namespace: the oracle LoadRouting's faster passes must agree with.
func referenceLoad(ctx context.Context, s *store.Store) (*store.RoutingState, error) {
	info, err := s.RoutingInfo(ctx)
	if err != nil {
		return nil, err
	}
	st := &store.RoutingState{Seq: info.State.LastSeq}
	nss, err := s.CommittedNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	for _, ns := range nss {
		c, err := s.LiveCommit(ctx, ns)
		if err != nil {
			return nil, err
		}
		insts, machines, err := s.RoutingRecords(ctx, ns)
		if err != nil {
			return nil, err
		}
		st.Services = append(st.Services, storetest.Events(c, nil, insts, machines)...)
	}
	err = s.ListMachines(ctx, func(m *store.MachineRecord) error {
		st.Machines = append(st.Machines, *m)
		return nil
	})
	return st, err
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLoadRoutingMatchesReference holds LoadRouting, which reads the last
// signed event of every routing subject, to the routing derived from stored
// intent the plain way: live commits of several namespaces (one redeployed,
// one with a removed service, one with unroutable instances), checkpoint
// commits, and machines.
func TestLoadRoutingMatchesReference(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	empty, err := s.LoadRouting(ctx)
	if err != nil || len(empty.Services) != 0 {
		t.Fatalf("empty store: %v %+v", err, empty)
	}
	for i := 0; i < 3; i++ {
		if _, _, err := storetest.Deploy(ctx, s, "a", map[string]storetest.Service{
			"web": web("10.0.0.9", 9000+i, "a-w"+strconv.Itoa(i)),
			"api": web("10.0.0.9", 9100+i, "a-api"+strconv.Itoa(i), "a-api-x"+strconv.Itoa(i)),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := storetest.Deploy(ctx, s, "b", map[string]storetest.Service{
		"web": {Routes: web("", 0).Routes, Instances: []storetest.Instance{
			{ID: "b1", Machine: "m4", Address: "10.0.0.1", Port: 80},
			{ID: "b2", Machine: "m2", Address: "10.0.0.2", Port: 80, State: store.InstanceDraining},
			{ID: "b3", Machine: "m3", Address: "10.0.0.3", Port: 80, Error: "crashed"},
			{ID: "b4", Machine: "m4", Address: "10.0.0.1", Port: 0},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := storetest.Deploy(ctx, s, "b", map[string]storetest.Service{"other": web("10.0.0.9", 81, "b9")}); err != nil {
		t.Fatal(err)
	}
	cp := &store.DeployCommit{ID: "c-cp", Namespace: "c", Kind: store.CommitCheckpoint, Phase: "p1", Revision: 1,
		Manifest: store.Manifest{Namespace: "c"}}
	if _, err := s.AppendCommit(ctx, cp); err != nil {
		t.Fatal(err)
	}
	// Each machine where its instances were last routed (the reference
	// derives their endpoints from the machines as they are now).
	for id, addr := range map[string]string{"m2": "10.0.0.2", "m1": "10.0.0.9"} {
		rec := &store.MachineRecord{Version: 1, ID: id, State: store.MachineActive, Address: addr}
		if _, err := store.PutJSON(ctx, store.BucketOf(s, s.Names.MachinesBucket()), id, rec); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: rec}}); err != nil {
			t.Fatal(err)
		}
	}
	want, err := referenceLoad(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	norm := func(rs *store.RoutingState) string {
		for i := range rs.Services {
			rs.Services[i].At = time.Time{}
		}
		b, _ := json.Marshal(rs)
		return string(b)
	}
	if g, w := norm(got), norm(want); g != w {
		t.Errorf("LoadRouting differs from the reference reading:\n got %s\nwant %s", g, w)
	}
}

func web(addr string, port int, ids ...string) storetest.Service {
	s := storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com", "*.shop.example.com"}}}}
	for _, id := range ids {
		s.Instances = append(s.Instances, storetest.Instance{ID: id, Machine: "m1", Address: addr, Port: port})
	}
	return s
}
