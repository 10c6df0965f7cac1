package routing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Every bad republish request is a clear, structured refusal and publishes
// nothing; a good one publishes exactly the stored state.
func TestRepublishRequests(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := context.Background()

	_, err := s.RequestRepublish(ctx, "m1", "shop", "web")
	var f *store.RPCFailure
	if !errors.As(err, &f) || f.Cause != store.CauseNoResponders || f.Detail != "no control server is answering routing republish requests" {
		t.Fatalf("without a control server: %v", err)
	}

	stop, err := routing.ServeRepublish(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	events := storetest.Stream(t, s, s.Names.RoutingEventsStream())
	head := func() uint64 {
		info, err := events.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	if _, err := s.RequestRepublish(ctx, "m1", "shop", "web"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("namespace without a commit: want not_found, got %v", err)
	}
	commit := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {}}},
		Slots:    []store.SlotAssignment{{Service: "web", Slot: 0, InstanceID: "w1", Machine: "m1", Revision: 1}}}
	if _, err := s.AppendCommit(ctx, commit); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateMachine(ctx, &store.MachineRecord{ID: "m1", State: store.MachineActive, Address: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, inst := range []store.InstanceRecord{
		{ID: "w1", Namespace: "shop", Service: "web", Revision: 1, Machine: "m1", Address: "127.0.0.1", Port: 8080, State: store.InstanceReady},
		// An instance of a service the live commit dropped.
		{ID: "o1", Namespace: "shop", Service: "old", Revision: 1, Machine: "m1", Address: "127.0.0.1", Port: 8081, State: store.InstanceReady},
	} {
		if _, err := s.PutInstance(ctx, &inst); err != nil {
			t.Fatal(err)
		}
	}
	before := head()
	for _, tc := range []struct {
		name, machine, ns, service, code string
	}{
		{"service m2 runs nothing of", "m2", "shop", "web", store.CodeNotFound},
		{"unknown service", "m1", "shop", "nope", store.CodeNotFound},
		{"namespace not a token", "m1", "shop.x", "web", store.CodeInvalid},
		{"empty service", "m1", "shop", "", store.CodeInvalid},
	} {
		if _, err := s.RequestRepublish(ctx, tc.machine, tc.ns, tc.service); !store.HasCode(err, tc.code) {
			t.Errorf("%s: want %s, got %v", tc.name, tc.code, err)
		}
	}
	rep, err := s.NC.RequestWithContext(ctx, s.Names.RoutingRepublishSubject("m1"), []byte("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkReplyCode(rep, store.CodeInvalid); err != nil {
		t.Errorf("malformed request: %v", err)
	}
	// A service the commit dropped has nothing to publish.
	if seq, err := s.RequestRepublish(ctx, "m1", "shop", "old"); err != nil || seq != 0 {
		t.Errorf("dropped service: seq %d, %v", seq, err)
	}
	if got := head(); got != before {
		t.Fatalf("refused requests published %d events", got-before)
	}

	ev := republished(t, s, s, "m1", "shop", "web")
	if ev.DeployID != "d1" || len(ev.Endpoints) != 1 || ev.Endpoints[0].InstanceID != "w1" || ev.Endpoints[0].Port != 8080 {
		t.Fatalf("republished event: %+v", ev)
	}
}

// republished has asker ask, as machine, for a republish of ns/svc and
// reads the event it published from reader's view of the routing stream.
func republished(t *testing.T, asker, reader *store.Store, machine, ns, svc string) store.RoutingEvent {
	t.Helper()
	ctx := context.Background()
	seq, err := asker.RequestRepublish(ctx, machine, ns, svc)
	if err != nil {
		t.Fatalf("machine %s asking to republish %s/%s: %v", machine, ns, svc, err)
	}
	msg, err := storetest.Stream(t, reader, reader.Names.RoutingEventsStream()).GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	var ev store.RoutingEvent
	if err := store.Decode("routing event", msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// checkReplyCode checks that a raw RPC reply carries an error with code.
func checkReplyCode(m *nats.Msg, code string) error {
	var rep struct {
		Error *store.Error `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return fmt.Errorf("undecodable reply %q: %w", m.Data, err)
	}
	if rep.Error == nil || rep.Error.Code != code {
		return fmt.Errorf("want %s, got %s", code, m.Data)
	}
	return nil
}
