package enroll_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
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
	tok, _, err := invites.Create(context.Background(), f.node.Store, invites.Spec{Region: "eu", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return invites.WithCAs(tok, fps)
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
	if _, err := invites.Redeem(context.Background(), f.node.Store, tok, "m9", store.InviteUseEnroll); err != nil {
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
		"an unknown token": {Token: invites.WithCAs(store.InviteTokenPrefix+"unknown", f.fps), Machine: "m3"},
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

// startRenewing is start with credentials of lifetime ttl, renewed by the
// node's control plane.
func startRenewing(t *testing.T, ttl time.Duration) *fixture {
	t.Helper()
	n, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Auth: storagenode.AuthOn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	srv, err := enroll.Serve(t.Context(), enroll.ServerConfig{Listen: "127.0.0.1:0", TLS: n.TLS.ServerConfig(), Store: n.Store, Auth: n.Auth,
		CredsTTL: ttl, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	stop, err := enroll.ServeRenewals(t.Context(), enroll.RenewalConfig{Store: n.Store, Auth: n.Auth, CredsTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return &fixture{node: n, srv: srv, fps: []string{pki.Fingerprint(n.Auth.TLS.CA.Cert)}}
}

// joinedBox enrolls machine m1 with an invite and opens the store as its
// agent, over a connection with the credentials file it was given (file);
// both end with the test.
func (f *fixture) joinedBox(t *testing.T) (file string, s *store.Store) {
	t.Helper()
	files, err := enroll.Join(t.Context(), enroll.JoinRequest{Token: f.invite(t, f.fps), Machine: "m1", Addrs: []string{f.srv.Addr().String()}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	file = files[storagenode.RoleAgent]
	nc, err := store.Connect(store.ConnectOptions{URL: f.node.Server.ClientURL(), CredsFile: file, ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s, err = store.Open(t.Context(), nc, f.node.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	return file, s
}

// renewing runs the box's renewal on s until the test ends.
func renewing(t *testing.T, s *store.Store) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		store.RenewCreds(ctx, s, func(err error) { t.Logf("renewal: %v", err) })
	}()
	t.Cleanup(func() { stop(); <-done })
}

// A running box renews its credentials at two thirds of their lifetime
// over its connection: a new key made on the box, the same role, machine
// and inbox, the fleet's lifetime, recorded; the connection goes on with
// the new key and the old one is revoked.
func TestRunningBoxRenewsItsCredentials(t *testing.T) {
	f := startRenewing(t, 6*time.Second)
	ctx := context.Background()
	file, s := f.joinedBox(t)
	before, _ := os.ReadFile(file)
	oldKey, _ := store.UserOfCreds(before)
	oldCopy := filepath.Join(t.TempDir(), "old.creds")
	_ = os.WriteFile(oldCopy, before, 0o600)
	renewing(t, s)

	var renewed store.IssuedCredential
	deadline := time.Now().Add(20 * time.Second)
	for renewed.User == "" {
		if time.Now().After(deadline) {
			t.Fatal("no renewal within 20s of 6s credentials")
		}
		list, _ := f.node.Store.ListCredentials(ctx, "m1", storagenode.RoleAgent)
		for _, c := range list {
			if c.How == store.IssuedByRenewal && c.RenewedFrom == oldKey.User {
				renewed = c
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if life := renewed.ExpiresAt.Sub(renewed.IssuedAt); life < 5*time.Second || life > 7*time.Second {
		t.Errorf("renewed for %s, want the fleet's 6s", life)
	}
	// The file holds the new key, 0600; the old key is revoked once the
	// connection switched; the connection works with the new key.
	storeEventually(t, 10*time.Second, "the old key retired", func() bool {
		list, _ := f.node.Store.ListCredentials(ctx, "m1", storagenode.RoleAgent)
		for _, c := range list {
			if c.User == oldKey.User {
				return !c.RevokedAt.IsZero()
			}
		}
		return false
	})
	after, _ := os.ReadFile(file)
	cur, _ := store.UserOfCreds(after)
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 || !strings.Contains(string(after), store.BundleHeader) {
		t.Errorf("renewed file: mode %v, bundle kept %v", fi.Mode().Perm(), strings.Contains(string(after), store.BundleHeader))
	}
	if cur.User == oldKey.User || cur.Role != storagenode.RoleAgent || cur.Machine != "m1" {
		t.Fatalf("the file holds %+v", cur)
	}
	if err := s.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatalf("the renewed connection: %v", err)
	}
	storeEventually(t, 10*time.Second, "the old key refused", func() bool {
		nc, err := store.Connect(store.ConnectOptions{URL: f.node.Server.ClientURL(), CredsFile: oldCopy, Timeout: time.Second})
		if err == nil {
			nc.Close()
		}
		return err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization")
	})
}

// Renewal abuse: credentials renew only their own recorded key, for the
// fleet's lifetime and their own role: a request naming a lifetime, a
// role or a machine is refused, so is retiring a key not renewed from,
// and credentials never recorded renew nothing.
func TestRenewalRefusals(t *testing.T) {
	f := startRenewing(t, time.Hour)
	ctx := context.Background()
	files, err := enroll.Join(ctx, enroll.JoinRequest{Token: f.invite(t, f.fps), Machine: "m1", Addrs: []string{f.srv.Addr().String()}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	names := f.node.Store.Names
	call := func(creds, subject string, body any) error {
		nc, err := store.Connect(store.ConnectOptions{URL: f.node.Server.ClientURL(), CredsFile: creds})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return store.Call(c, nc, subject, "m1", "creds", body, nil)
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	agent := files[storagenode.RoleAgent]
	renewAgent := names.CredsSubject("renew", "agent", "m1")
	for name, body := range map[string]any{
		"a longer lifetime": map[string]any{"version": 1, "public_key": pub, "ttl": "8760h"},
		"another role":      map[string]any{"version": 1, "public_key": pub, "role": "control"},
		"another machine":   map[string]any{"version": 1, "public_key": pub, "machine": "m2"},
		"not a user key":    map[string]any{"version": 1, "public_key": "ABC"},
	} {
		if err := call(agent, renewAgent, body); !store.HasCode(err, store.CodeInvalid) {
			t.Errorf("renewal asking for %s: %v, want invalid", name, err)
		}
	}
	if err := call(agent, names.CredsSubject("retire", "agent", "m1"), store.CredsRetirement{Version: 1, User: pub}); !store.HasCode(err, store.CodeUnauthorized) {
		t.Errorf("retiring a key not renewed from: %v", err)
	}
	unrecorded := filepath.Join(t.TempDir(), "unrecorded.creds")
	b, _ := f.node.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1", Names: names, TTL: time.Hour})
	_ = os.WriteFile(unrecorded, b, 0o600)
	if err := call(unrecorded, renewAgent, store.CredsRenewal{Version: 1, PublicKey: pub}); !store.HasCode(err, store.CodeUnauthorized) {
		t.Errorf("unrecorded credentials renewing: %v", err)
	}
	if list, _ := f.node.Store.ListCredentials(ctx, "m1", ""); len(list) != 3 {
		t.Fatalf("credentials of m1 after the refusals: %+v", list)
	}
}

func storeEventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
