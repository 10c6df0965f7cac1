package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An agent joins once with an invite and starts from its saved identity
// after; every way of naming the wrong machine is refused with a code to
// act on, and nothing is recorded for it.
func TestIdentify(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := machines.ServeAdmission(ctx, srv.Store)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()

	if _, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("no identity and no token: %v, want not_found", err)
	}
	token, _, err := srv.Store.CreateInvite(ctx, "eu", nil, 0)
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
	// A new address is recorded by the control plane.
	if rec, err := Identify(ctx, srv.Store, JoinRequest{DataDir: dir, Advertise: "127.0.0.3"}); err != nil || rec.Address != "127.0.0.3" {
		t.Fatalf("a new address: %+v %v", rec, err)
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
