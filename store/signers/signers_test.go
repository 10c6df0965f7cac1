package signers_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// webAt is service web of one instance id at addr:port.
func webAt(addr string, port int, id string) storetest.Service {
	return storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
		Instances: []storetest.Instance{{ID: id, Machine: "m1", Address: addr, Port: port}}}
}

// Retiring a signer keeps what it signed and refuses what it signs later,
// even from a process that still holds its key.
func TestRetiredSignerIsRefusedFromItsRetirementOn(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := srv.Store
	if _, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{"web": webAt("127.0.0.1", 9000, "w1")}); err != nil {
		t.Fatal(err)
	}
	old, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	root, err := signing.LoadRoot(srv.AuthDir())
	if err != nil || root == nil {
		t.Fatalf("root: %v", err)
	}
	if _, err := signers.Retire(ctx, s, root, old.PublicKey()); err != nil {
		t.Fatal(err)
	}
	subj := s.Names.RoutingServiceSubject("shop", "web")
	if why := storetest.Refused(t, ctx, s, subj); why != "" {
		t.Fatalf("an event signed before the retirement was refused: %s", why)
	}
	// A fresh reader, and the thief's process that kept the old key.
	reader := srv.Connect(t)
	thief := srv.Connect(t)
	thief.SignWith(store.StaticSigner{Key: old})
	if _, _, err := storetest.Deploy(ctx, thief, "shop", map[string]storetest.Service{"web": webAt("203.0.113.9", 80, "evil")}); err != nil {
		t.Fatal(err)
	}
	if why := storetest.Refused(t, ctx, reader, subj); why != signing.ReasonRetired {
		t.Fatalf("event signed after the retirement: refused for %q, want %q", why, signing.ReasonRetired)
	}
}

// Only a server key can be certified, and retiring an unknown signer says
// so; retiring twice changes nothing.
func TestCertifyAndRetireRefusals(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := signing.LoadRoot(srv.AuthDir())
	if err != nil || root == nil {
		t.Fatalf("root: %v", err)
	}
	if err := signers.Certify(ctx, srv.Store, root, store.SignerRecord{Key: root.PublicKey(), Name: "root as signer"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("certifying an operator key: %v, want invalid", err)
	}
	other, _ := signing.NewSigner()
	if _, err := signers.Retire(ctx, srv.Store, root, other.PublicKey()); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("retiring a signer never certified: %v, want not_found", err)
	}
	own, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	first, err := signers.Retire(ctx, srv.Store, root, own.PublicKey())
	if err != nil || first.Retired == nil {
		t.Fatalf("retire: %+v %v", first, err)
	}
	again, err := signers.Retire(ctx, srv.Store, root, own.PublicKey())
	if err != nil || !again.RetiredAt.Equal(*first.RetiredAt) {
		t.Fatalf("retiring again moved the retirement: %+v %v", again, err)
	}
}
