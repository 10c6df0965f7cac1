package machines_test

import (
	"context"
	"testing"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// On a store other boxes reach, an agent cannot have its machine admitted
// at a loopback address: gateways would dial their own box for its
// instances. Only an invite the operator pinned to that address admits it
// there, and a pinned invite admits at no other. A refusal spends nothing.
func TestLoopbackJoinsNeedTheOperatorsWord(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := machines.ServeAdmission(ctx, srv.Store, machines.AdmissionPolicy{LoopbackJoins: false})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	join := func(token, machine, address string) (*store.MachineRecord, error) {
		return machines.RequestAdmission(ctx, srv.Store, machines.AdmitJoin, machines.AdmissionRequest{Machine: machine, Token: token, Address: address})
	}

	token, _, err := invites.Create(ctx, srv.Store, invites.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1", "127.0.0.2", "::1"} {
		if _, err := join(token, "thief", addr); !store.HasCode(err, store.CodeInvalid) {
			t.Fatalf("a join at %s with an invite that pins nothing: %v, want invalid", addr, err)
		}
	}
	if _, err := machines.Get(ctx, srv.Store, "thief"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a refused join recorded the machine: %v", err)
	}
	// Nothing was spent: the same invite admits the box at an address
	// other boxes reach.
	if rec, err := join(token, "m1", "10.0.0.1"); err != nil || rec.Address != "10.0.0.1" {
		t.Fatalf("a join at 10.0.0.1 after the refusals: %+v %v", rec, err)
	}

	pinned, inv, err := invites.Create(ctx, srv.Store, invites.Spec{Address: "127.0.0.1"})
	if err != nil || inv.Address != "127.0.0.1" {
		t.Fatalf("a pinned invite: %+v %v", inv, err)
	}
	if _, err := join(pinned, "m2", "10.0.0.2"); !store.HasCode(err, store.CodeInvalid) || store.AsError(err).Detail["invite_address"] != "127.0.0.1" {
		t.Fatalf("a join elsewhere than the invite pins: %v, want invalid naming the pinned address", err)
	}
	if rec, err := join(pinned, "m2", "127.0.0.1"); err != nil || rec.Address != "127.0.0.1" {
		t.Fatalf("a join at the pinned loopback address: %+v %v", rec, err)
	}
	if _, _, err := invites.Create(ctx, srv.Store, invites.Spec{Address: "not-an-ip"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("an invite pinned to a non-address: %v, want invalid", err)
	}
}

// A store on loopback alone (a single host, a test bed) admits machines
// at loopback: no other box can ask.
func TestLoopbackJoinsOnALoopbackStore(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := machines.ServeAdmission(ctx, srv.Store, machines.AdmissionPolicy{LoopbackJoins: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	token, _, err := invites.Create(ctx, srv.Store, invites.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := machines.RequestAdmission(ctx, srv.Store, machines.AdmitJoin, machines.AdmissionRequest{Machine: "m1", Token: token, Address: "127.0.0.1"})
	if err != nil || rec.Address != "127.0.0.1" {
		t.Fatalf("a loopback join on a loopback store: %+v %v", rec, err)
	}
}
