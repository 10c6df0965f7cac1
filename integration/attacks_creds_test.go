package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
)

// enrollAddr is where the fixture's control server answers enrollments.
func (f *attackFixture) enrollAddr(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`enrollment of invited boxes on https://(\S+)/v1/enroll`).FindStringSubmatch(f.c.server.output())
	if m == nil {
		t.Fatalf("the server does not enroll:\n%s", f.c.server.output())
	}
	return m[1]
}

// credsOf lists the recorded credentials of machine, as `control creds ls`
// shows them.
func (f *attackFixture) credsOf(t *testing.T, machine string) []store.IssuedCredential {
	t.Helper()
	var list []store.IssuedCredential
	if err := json.Unmarshal([]byte(f.c.mustControl("creds", "ls", "--machine", machine, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	return list
}

// 13. An invite admits a new machine, once. With one invite, `control agent
// --join TOKEN --machine m1 --join-only` (m1 exists) gets nothing: no
// credentials signed or recorded, m1's record and address unchanged, the
// invite unspent. The invite then enrolls a new box; a second enrollment
// with it (the same machine or another) is refused, and so is a second
// admission or mesh registration with it over NATS, with the new box's
// own credentials. `control machine rm` revokes every key the box was
// issued.
func attackInvitesOnce(t *testing.T, f *attackFixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := f.enrollAddr(t)
	env := []string{"EDGEPLANE_NATS=" + f.c.url} // a box with nothing but an invite
	join := func(token, machine, dir string) (string, int) {
		out, errOut, code := runControl(t, env, "agent", "--data", dir, "--join", token, "--machine", machine, "--join-only", "--enroll", addr)
		return out + errOut, code
	}
	victim, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil {
		t.Fatal(err)
	}
	victimCreds := len(f.credsOf(t, "m1"))
	token := strings.TrimSpace(f.c.mustControl("machine", "invite"))

	thiefDir := filepath.Join(f.c.dir, "thief13")
	for range 2 {
		out, code := join(token, "m1", thiefDir)
		if code == 0 || !strings.Contains(out, "conflict") || !strings.Contains(out, "machine m1 is already a member") {
			t.Fatalf("enrolling as the existing machine m1: exit %d\n%s", code, out)
		}
	}
	if ents, _ := os.ReadDir(thiefDir); len(ents) != 0 {
		t.Fatalf("the refused enrollment wrote %d files", len(ents))
	}
	after, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil || after.Address != victim.Address || !after.JoinedAt.Equal(victim.JoinedAt) || after.State != victim.State {
		t.Fatalf("m1 after the attempts: %+v (%v), before %+v", after, err, victim)
	}
	if n := len(f.credsOf(t, "m1")); n != victimCreds {
		t.Fatalf("m1 has %d recorded credentials, had %d", n, victimCreds)
	}

	// The refusals did not spend the invite: it enrolls a new box, once.
	box := filepath.Join(f.c.dir, "box13")
	if out, code := join(token, "box13", box); code != 0 {
		t.Fatalf("the invite enrolling a new box: exit %d\n%s", code, out)
	}
	// However this ends, box13 does not stay: the next deploy would place
	// on it.
	defer func() {
		if _, err := machines.Get(context.Background(), f.c.store, "box13"); err == nil {
			f.c.mustControl("machine", "rm", "box13", "--force")
		}
	}()
	for _, again := range []struct{ machine, dir string }{{"box13", filepath.Join(f.c.dir, "box13-again")}, {"box13b", filepath.Join(f.c.dir, "box13b")}} {
		out, code := join(token, again.machine, again.dir)
		if code == 0 || !strings.Contains(out, "conflict") {
			t.Fatalf("a second enrollment with one invite, as %s: exit %d\n%s", again.machine, code, out)
		}
		if _, err := os.Stat(filepath.Join(again.dir, "agent.creds")); err == nil {
			t.Fatalf("a second enrollment as %s wrote credentials", again.machine)
		}
	}
	if _, err := machines.Get(ctx, f.c.store, "box13b"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("box13b recorded: %v", err)
	}
	// Over NATS with the box's own credentials: admission again, and its
	// meshd registering twice with the invite.
	agent := f.as(t, filepath.Join(box, "agent.creds"))
	agent.try(t, "box13 admitted again with its invite", func(ctx context.Context) error {
		_, err := machines.RequestAdmission(ctx, agent.st, machines.AdmitJoin, machines.AdmissionRequest{Machine: "box13", Token: token, Address: "203.0.113.66"})
		return err
	})
	if _, err := machines.RequestAdmission(ctx, f.c.store, machines.AdmitJoin, machines.AdmissionRequest{Machine: "box13c", Token: token, Address: "203.0.113.66"}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("the spent invite admitting another machine (asked with control credentials): %v", err)
	}
	meshDir := filepath.Join(f.c.dir, "box13-mesh")
	register := func() error {
		_, err := node.Join(ctx, node.JoinOptions{Token: token, DataDir: meshDir, NATSURL: f.c.url, CredsFile: filepath.Join(box, "mesh.creds"),
			Machine: "box13", Mode: "netstack", Bind: "127.0.0.1"})
		return err
	}
	if err := register(); err != nil {
		t.Fatalf("box13's meshd registering with its invite: %v", err)
	}
	if err := register(); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("box13's meshd registering twice with one invite: %v", err)
	}
	if rec, err := machines.Get(ctx, f.c.store, "box13"); err != nil || rec.Address != "127.0.0.1" {
		t.Fatalf("box13 after the attempts: %+v %v", rec, err)
	}
	issued := f.credsOf(t, "box13")
	if len(issued) != 3 {
		t.Fatalf("box13's recorded credentials: %+v", issued)
	}

	// Removing the machine revokes every key it was issued.
	out := f.c.mustControl("machine", "rm", "box13", "--force")
	if !strings.Contains(out, "revoked 3 recorded credentials") {
		t.Fatalf("machine rm:\n%s", out)
	}
	for _, c := range f.credsOf(t, "box13") {
		if c.RevokedAt.IsZero() {
			t.Errorf("%s key %s not revoked", c.Role, c.User)
		}
	}
	eventually(t, 10*time.Second, "box13's credentials refused", func() bool {
		nc, err := store.Connect(store.ConnectOptions{URL: f.c.url, CredsFile: filepath.Join(box, "agent.creds"), Timeout: 2 * time.Second})
		if err == nil {
			nc.Close()
		}
		return err != nil
	})
}

// 14. Renewal abuse. Agent credentials of m1 ask to renew as another
// machine or another role (refused by their permissions), or on their own
// subject for a longer lifetime or another role (refused by the control
// plane, which renews only the asking key's record), or to retire a key
// they were not renewed from; a gateway asks for another gateway's name.
// Nothing is signed, recorded or revoked. Stolen credentials that expired
// connect nowhere: the client says they expired and what to do, and the
// storage node refuses a thief who sends them anyway.
func attackRenewals(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	records := bucketMsgs(t, f.c.store, n.CredentialsBucket())
	revocations := bucketMsgs(t, f.c.store, n.RevocationsBucket())
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	ask := func(th *thief, subject string, body any) func(context.Context) error {
		return func(ctx context.Context) error {
			var rep store.CredsRenewed
			err := store.Call(ctx, th.nc, subject, "m1", "creds", body, &rep)
			if err == nil && rep.JWT != "" {
				t.Errorf("%s answered a JWT", subject)
			}
			return err
		}
	}
	agent := f.as(t, f.agentCreds)
	renewal := store.CredsRenewal{Version: store.RecordVersion, PublicKey: pub}
	agent.try(t, "agent m1 renews as machine m2", ask(agent, n.CredsSubject("renew", "agent", "m2"), renewal))
	agent.try(t, "agent m1 renews as mesh m1", ask(agent, n.CredsSubject("renew", "mesh", "m1"), renewal))
	agent.try(t, "agent m1 renews as gateway gw1", ask(agent, n.CredsSubject("renew", "gateway", "gw1"), renewal))
	for what, body := range map[string]any{
		"for a year":                 map[string]any{"version": 1, "public_key": pub, "ttl": "8760h"},
		"as the control role":        map[string]any{"version": 1, "public_key": pub, "role": "control"},
		"for machine m2":             map[string]any{"version": 1, "public_key": pub, "machine": "m2"},
		"keeping its own key":        store.CredsRenewal{Version: store.RecordVersion, PublicKey: mustUser(t, f.agentCreds)},
		"retiring the gateway's key": nil,
	} {
		subject := n.CredsSubject("renew", "agent", "m1")
		if body == nil {
			subject, body = n.CredsSubject("retire", "agent", "m1"), store.CredsRetirement{Version: store.RecordVersion, User: mustUser(t, f.gwCreds)}
		}
		agent.try(t, "agent m1 on its own subject "+what, ask(agent, subject, body))
	}
	gw := f.as(t, f.gwCreds)
	gw.try(t, "gateway gw1 renews as gateway gw2", ask(gw, n.CredsSubject("renew", "gateway", "gw2"), renewal))
	gw.try(t, "gateway gw1 renews as agent m1", ask(gw, n.CredsSubject("renew", "agent", "m1"), renewal))
	if got := bucketMsgs(t, f.c.store, n.CredentialsBucket()); got != records {
		t.Fatalf("credential records: %d, were %d", got, records)
	}
	if got := bucketMsgs(t, f.c.store, n.RevocationsBucket()); got != revocations {
		t.Fatalf("revocations: %d, were %d", got, revocations)
	}
	if list := f.credsOf(t, "gw1"); len(list) == 0 || !list[0].RevokedAt.IsZero() {
		t.Fatalf("gw1's credentials: %+v", list)
	}

	// Expired credentials, stolen.
	expired := filepath.Join(f.c.dir, "stolen-expired.creds")
	f.c.mustControl("creds", "issue", "--role", "agent", "--machine", "m1", "--data", f.c.serverDir(), "-o", expired, "--ttl", "1s")
	time.Sleep(2 * time.Second) // JWT expiry has one-second granularity
	_, err := store.Connect(store.ConnectOptions{URL: f.c.url, CredsFile: expired, Timeout: 2 * time.Second})
	if se := store.AsError(err); se == nil || se.Code != store.CodeUnauthorized || !strings.Contains(se.Message, "expired at") || !strings.Contains(se.Message, "invited again") {
		t.Fatalf("connecting with expired credentials: %v", err)
	}
	nc, err := nats.Connect(f.c.url, nats.UserCredentials(expired), nats.RootCAs(filepath.Join(f.c.serverDir(), "auth", "tls", "bundle.crt")),
		nats.TLSHandshakeFirst(), nats.Timeout(2*time.Second))
	if err == nil {
		nc.Close()
		t.Fatal("the storage node accepted expired credentials")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") && !strings.Contains(strings.ToLower(err.Error()), "expired") {
		t.Fatalf("expired credentials sent anyway: %v, want refused", err)
	}
	t.Logf("expired credentials sent anyway: refused (%v)", err)
}

// mustUser is the user public key of a credentials file.
func mustUser(t *testing.T, creds string) string {
	t.Helper()
	b, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.UserOfCreds(b)
	if err != nil {
		t.Fatal(err)
	}
	return r.User
}
