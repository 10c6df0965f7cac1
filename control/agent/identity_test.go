package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An agent joins once with an invite and starts from its saved identity
// after; every way of naming the wrong machine is refused with a code to
// act on, and nothing is recorded for it.
func TestIdentify(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := machines.ServeAdmission(ctx, srv.Store, machines.AdmissionPolicy{LoopbackJoins: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()

	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("no identity and no token: %v, want not_found", err)
	}
	token, _, err := invites.Create(ctx, srv.Store, invites.Spec{Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Token: token, Machine: "m1", Advertise: "not-an-ip"}); !errors.Is(err, ErrBadAdvertise) || !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("a bad address: %v, want invalid wrapping ErrBadAdvertise", err)
	}
	rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Token: token, Machine: "m1", Advertise: "127.0.0.2"})
	if err != nil || rec.ID != "m1" || rec.Address != "127.0.0.2" || rec.Region != "eu" {
		t.Fatalf("join: %+v %v", rec, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, IdentityFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved identity: %v %v", fi, err)
	}

	// Later starts need the data dir alone.
	if rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir}); err != nil || rec.ID != "m1" || rec.Address != "127.0.0.2" {
		t.Fatalf("restart from the saved identity: %+v %v", rec, err)
	}
	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Machine: "m2"}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("the data dir of m1 named m2: %v, want conflict", err)
	}
	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Advertise: "bad"}); !errors.Is(err, ErrBadAdvertise) {
		t.Fatalf("a bad new address: %v", err)
	}
	if _, err := machines.Get(ctx, srv.Store, "m2"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a refused request recorded m2: %v", err)
	}
	// Restarted with --join, a box that joined starts from its identity and
	// does not spend the invite again; a second admission with it is
	// refused, whoever asks.
	if rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Token: token, Machine: "m1"}); err != nil || rec.ID != "m1" {
		t.Fatalf("restarted with --join: %+v %v", rec, err)
	}
	if _, err := machines.RequestAdmission(ctx, srv.Store, machines.AdmitJoin, machines.AdmissionRequest{Machine: "m1", Token: token, Address: "127.0.0.9"}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("a second admission with one invite: %v, want conflict", err)
	}
	// A new address is where every gateway would send the machine's
	// traffic: the operator's to record, and the agent is told how.
	_, err = Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Advertise: "127.0.0.3"})
	if !store.HasCode(err, store.CodeInvalid) || store.AsError(err).Detail["command"] != "control machine address m1 127.0.0.3" {
		t.Fatalf("an agent moving its machine: %v, want invalid naming the operator's command", err)
	}
	if rec, err := machines.Get(ctx, srv.Store, "m1"); err != nil || rec.Address != "127.0.0.2" {
		t.Fatalf("after the refused move: %+v %v", rec, err)
	}
	if _, err := machines.SetAddress(ctx, srv.Store, "m1", "127.0.0.3"); err != nil {
		t.Fatal(err)
	}
	if rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Advertise: "127.0.0.3"}); err != nil || rec.Address != "127.0.0.3" {
		t.Fatalf("started at the address the operator recorded: %+v %v", rec, err)
	}
	// The mesh IP the registrar recorded for it the agent may move to.
	peer := store.MeshPeerRecord{Version: store.RecordVersion, Machine: "m1", PublicKey: "k", MeshIP: "127.0.0.9", RegisteredAt: time.Now()}
	if _, err := srv.Store.PutMeshPeer(ctx, &peer); err != nil {
		t.Fatal(err)
	}
	if rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Advertise: "127.0.0.9"}); err != nil || rec.Address != "127.0.0.9" {
		t.Fatalf("a move to the machine's mesh IP: %+v %v", rec, err)
	}
	// Nor to another member's address: gateways would take that
	// machine's endpoints for this one's.
	if err := srv.Store.CreateMachine(ctx, &store.MachineRecord{ID: "m3", State: store.MachineActive, Address: "10.100.0.3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := machines.SetAddress(ctx, srv.Store, "m1", "10.100.0.3"); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("the operator moving m1 to m3's address: %v, want conflict", err)
	}
	token2, _, err := invites.Create(ctx, srv.Store, invites.Spec{Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: t.TempDir(), Token: token2, Machine: "m4", Advertise: "10.100.0.3"}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("joining at m3's address: %v, want conflict", err)
	}
	// No one moves a machine where no endpoint may be.
	for _, addr := range []string{"169.254.169.254", "fe80::1", "0.0.0.0", "224.0.0.1"} {
		if _, err := machines.SetAddress(ctx, srv.Store, "m1", addr); !store.HasCode(err, store.CodeInvalid) {
			t.Fatalf("the operator moving m1 to %s: %v, want invalid", addr, err)
		}
	}
}

func TestConnectEngineNone(t *testing.T) {
	if c, err := ConnectEngine(context.Background(), EngineNone, nil); c != nil || err != nil {
		t.Fatalf("none: %v %v", c, err)
	}
	if _, err := ConnectEngine(context.Background(), "unix:///nonexistent/engine.sock", zap.NewNop()); err == nil {
		t.Fatal("a socket that is not there connected")
	}
}
