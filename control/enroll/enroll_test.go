package enroll_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

type fixture struct {
	node *storagenode.Node
	srv  *enroll.Server
	fps  []string
}

// start boots a storage node with credentials (so TLS) and its enrollment
// server on loopback.
func start(t *testing.T) *fixture {
	t.Helper()
	n, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Auth: storagenode.AuthOn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	srv, err := enroll.Serve(t.Context(), enroll.ServerConfig{Listen: "127.0.0.1:0", TLS: n.TLS.ServerConfig(), Store: n.Store, Auth: n.Auth, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &fixture{node: n, srv: srv, fps: []string{pki.Fingerprint(n.Auth.TLS.CA.Cert)}}
}

func (f *fixture) invite(t *testing.T, fps []string) string {
	t.Helper()
	tok, _, err := f.node.Store.CreateInvite(context.Background(), "eu", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return store.InviteWithCAs(tok, fps)
}

// A box enrolls with its invite: it gets a credentials file per role,
// holding the key it made and a JWT for that key, and the fleet CA; its
// agent credentials then connect over TLS and act as that machine.
func TestJoinWritesCredentialsForTheBoxsOwnKeys(t *testing.T) {
	f := start(t)
	dir := t.TempDir()
	files, err := enroll.Join(context.Background(), enroll.JoinRequest{Token: f.invite(t, f.fps), Machine: "m1",
		Addrs: []string{"127.0.0.1:1", f.srv.Addr().String()}, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("files %v", files)
	}
	for role, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v", file, fi.Mode().Perm())
		}
		tok, err := jwt.ParseDecoratedJWT(b)
		if err != nil {
			t.Fatal(err)
		}
		uc, _ := jwt.DecodeUserClaims(tok)
		kp, err := jwt.ParseDecoratedUserNKey(b)
		if err != nil {
			t.Fatal(err)
		}
		if pub, _ := kp.PublicKey(); pub != uc.Subject {
			t.Errorf("%s: the JWT is for %s, the file's key is %s", role, uc.Subject, pub)
		}
		if !strings.Contains(strings.Join(uc.Tags, " "), "machine:m1") || !strings.Contains(string(b), store.BundleHeader) {
			t.Errorf("%s: tags %v, or no bundle", role, uc.Tags)
		}
	}
	nc, err := store.Connect(store.ConnectOptions{URL: f.node.Server.ClientURL(), CredsFile: files[storagenode.RoleAgent]})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s, err := store.Open(context.Background(), nc, f.node.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutMachineBeat(context.Background(), "m1", time.Second); err != nil {
		t.Fatalf("the enrolled agent writes its own heartbeat: %v", err)
	}
	if err := s.PutMachineBeat(context.Background(), "m2", time.Second); err == nil {
		t.Fatal("the enrolled agent wrote another machine's heartbeat")
	}
}

// A node that cannot show the CA the invite names is told nothing: the
// invite stays unspent. A spent or unknown invite, another machine's, or a
// role an invite cannot give, is refused and no file is written.
func TestJoinRefusals(t *testing.T) {
	f := start(t)
	other, _ := pki.NewCA("another fleet", 0)
	tok := f.invite(t, []string{pki.Fingerprint(other.Cert)})
	dir := t.TempDir()
	_, err := enroll.Join(context.Background(), enroll.JoinRequest{Token: tok, Machine: "m1", Addrs: []string{f.srv.Addr().String()}, Dir: dir})
	if se := store.AsError(err); se == nil || se.Code != store.CodeTLS || !strings.Contains(se.Message, "holds no CA the invite names") || !strings.Contains(se.Message, "nothing was sent") {
		t.Fatalf("a node without the invite's CA: %v", err)
	}
	if _, err := f.node.Store.RedeemInvite(context.Background(), tok, "m9", store.InviteUseEnroll); err != nil {
		t.Fatalf("the invite was spent by a refused enrollment: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("files written: %v", ents)
	}

	good := f.invite(t, f.fps)
	if _, err := enroll.Join(context.Background(), enroll.JoinRequest{Token: good, Machine: "m1", Addrs: []string{f.srv.Addr().String()}, Dir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]enroll.JoinRequest{
		"another machine":  {Token: good, Machine: "m2"},
		"an unknown token": {Token: store.InviteWithCAs(store.InviteTokenPrefix+"unknown", f.fps), Machine: "m3"},
		"the control role": {Token: f.invite(t, f.fps), Machine: "m4", Roles: []string{storagenode.RoleControl}},
		"no CA named":      {Token: strings.Split(good, ".")[0], Machine: "m1"},
	} {
		r.Addrs, r.Dir = []string{f.srv.Addr().String()}, t.TempDir()
		if _, err := enroll.Join(context.Background(), r); err == nil {
			t.Errorf("%s: enrolled", name)
		}
		if ents, _ := os.ReadDir(r.Dir); len(ents) != 0 {
			t.Errorf("%s: files written: %v", name, ents)
		}
	}
}

// An invite enrolls a new machine, once: a second enrollment with it (the
// same machine or another) is refused, and so is a fresh invite naming a
// machine the fleet knows, before anything is signed, recorded or spent.
// Every key handed out is recorded with its machine, role and expiry.
func TestEnrollmentAdmitsANewMachineOnce(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	tok := f.invite(t, f.fps)
	join := func(tok, machine string) (map[string]string, error) {
		return enroll.Join(ctx, enroll.JoinRequest{Token: tok, Machine: machine, Addrs: []string{f.srv.Addr().String()}, Dir: t.TempDir()})
	}
	if _, err := join(tok, "m1"); err != nil {
		t.Fatal(err)
	}
	creds, err := f.node.Store.ListCredentials(ctx, "m1", "")
	if err != nil || len(creds) != 3 {
		t.Fatalf("recorded credentials of m1: %+v %v", creds, err)
	}
	for _, c := range creds {
		if c.How != store.IssuedByEnrollment || c.Machine != "m1" || c.ExpiresAt.Before(time.Now().Add(storagenode.DefaultCredsTTL-time.Hour)) {
			t.Errorf("record %+v", c)
		}
	}
	if _, err := join(tok, "m1"); !store.HasCode(err, store.CodeConflict) || !strings.Contains(err.Error(), "already redeemed") {
		t.Fatalf("a second enrollment with one invite: %v", err)
	}
	now := time.Now().UTC()
	if err := f.node.Store.CreateMachine(ctx, &store.MachineRecord{Version: store.RecordVersion, ID: "victim", State: store.MachineActive,
		Address: "192.0.2.7", JoinedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	fresh := f.invite(t, f.fps)
	if _, err := join(fresh, "victim"); !store.HasCode(err, store.CodeConflict) || !strings.Contains(err.Error(), "control machine rm victim") {
		t.Fatalf("enrolling as an existing machine: %v", err)
	}
	if creds, _ := f.node.Store.ListCredentials(ctx, "victim", ""); len(creds) != 0 {
		t.Fatalf("credentials recorded for the refused enrollment: %+v", creds)
	}
	// The refusal did not spend the fresh invite.
	if _, err := join(fresh, "m2"); err != nil {
		t.Fatalf("the invite a refused enrollment named: %v", err)
	}
}
