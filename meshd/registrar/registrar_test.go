package registrar_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/relay/relaytest"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func newKey(t *testing.T) string {
	var b [32]byte
	rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

func invite(t *testing.T, st *store.Store) string {
	tok, _, err := invites.Create(context.Background(), st, invites.Spec{Region: "eu", Labels: map[string]string{"tier": "edge"}, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// serve runs a registrar over st until the test ends.
func serve(t *testing.T, st *store.Store, cfg registrar.Config) *registrar.Registrar {
	t.Helper()
	r, err := registrar.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := r.Serve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return r
}

// registered registers each machine with a fresh key and returns their
// node secrets.
func registered(t *testing.T, st *store.Store, machines ...string) map[string]string {
	t.Helper()
	secrets := map[string]string{}
	for _, m := range machines {
		rep, err := register(context.Background(), st, store.MeshRegisterRequest{Token: invite(t, st), Machine: m, PublicKey: newKey(t)})
		if err != nil {
			t.Fatal(err)
		}
		secrets[m] = rep.Secret
	}
	return secrets
}

func register(ctx context.Context, st *store.Store, req store.MeshRegisterRequest) (*store.MeshRegisterReply, error) {
	var rep store.MeshRegisterReply
	err := store.Call(ctx, st.NC, st.Names.RegistrarSubject("register"), "registrar", "register", req, &rep)
	return &rep, err
}

// Concurrent joins over NATS get distinct addresses; the same machine
// registering again keeps its address.
func TestRegisterUniqueAndStable(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := registrar.Serve(ctx, srv.Store, registrar.Config{STUN: []string{"127.0.0.1:3478"}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const n = 8
	ips := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		tok := invite(t, srv.Store)
		key := newKey(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := register(ctx, srv.Store, store.MeshRegisterRequest{Token: tok, Machine: fmt.Sprintf("m%d", i),
				PublicKey: key, Endpoints: []string{"192.0.2.1:51820"}})
			if err != nil {
				errs <- err
				return
			}
			ips[i] = rep.MeshIP
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ip := range ips {
		if seen[ip] {
			t.Fatalf("duplicate mesh ip %s in %v", ip, ips)
		}
		seen[ip] = true
	}
	rec, err := srv.Store.MeshPeer(ctx, "m3")
	if err != nil || rec.MeshIP != ips[3] || rec.Region != "eu" || rec.Labels["tier"] != "edge" {
		t.Fatalf("peer record %+v %v", rec, err)
	}
	// Re-register m3 (same invite, same machine): same address.
	reg, _ := registrar.New(srv.Store, registrar.Config{})
	tok := invite(t, srv.Store)
	rep, err := reg.Register(ctx, store.MeshRegisterRequest{Token: tok, Machine: "m3", PublicKey: rec.PublicKey})
	if err != nil || rep.MeshIP != ips[3] {
		t.Fatalf("re-register: %+v %v (want %s)", rep, err, ips[3])
	}
}

// Bad requests fail with a clear structured error and write nothing.
func TestRegisterBadInput(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	reg, err := registrar.New(srv.Store, registrar.Config{})
	if err != nil {
		t.Fatal(err)
	}
	good := newKey(t)
	tok := invite(t, srv.Store)
	cases := []struct {
		name string
		req  store.MeshRegisterRequest
		code string
	}{
		{"bad machine", store.MeshRegisterRequest{Token: tok, Machine: "a.b", PublicKey: good}, store.CodeInvalid},
		{"bad key", store.MeshRegisterRequest{Token: tok, Machine: "m1", PublicKey: "nope"}, store.CodeInvalid},
		{"bad endpoint", store.MeshRegisterRequest{Token: tok, Machine: "m1", PublicKey: good, Endpoints: []string{"host"}}, store.CodeInvalid},
		{"garbage token", store.MeshRegisterRequest{Token: "xyz", Machine: "m1", PublicKey: good}, store.CodeInvalid},
		{"unknown token", store.MeshRegisterRequest{Token: store.InviteTokenPrefix + "zzz", Machine: "m1", PublicKey: good}, store.CodeNotFound},
		{"newer version", store.MeshRegisterRequest{Version: 99, Token: tok, Machine: "m1", PublicKey: good}, store.CodeInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := reg.Register(ctx, c.req)
			if !store.HasCode(err, c.code) {
				t.Fatalf("got %v, want code %s", err, c.code)
			}
		})
	}
	if list, err := srv.Store.MeshPeerList(ctx); err != nil || len(list) != 0 {
		t.Fatalf("bad requests wrote peers: %v %v", list, err)
	}
	// The invite is still unspent: a good request succeeds.
	if _, err := reg.Register(ctx, store.MeshRegisterRequest{Token: tok, Machine: "m1", PublicKey: good}); err != nil {
		t.Fatal(err)
	}
	// Another machine with the same key is refused.
	_, err = reg.Register(ctx, store.MeshRegisterRequest{Token: invite(t, srv.Store), Machine: "m2", PublicKey: good})
	if !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("duplicate key: %v", err)
	}
	// An invite used by m1 does not admit m3.
	_, err = reg.Register(ctx, store.MeshRegisterRequest{Token: tok, Machine: "m3", PublicKey: newKey(t)})
	if !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("reused invite: %v", err)
	}
	if _, err := registrar.New(srv.Store, registrar.Config{Subnet: "10.100.0.0/31"}); err == nil {
		t.Fatal("a /31 subnet was accepted")
	}
	if _, err := registrar.New(srv.Store, registrar.Config{Cooldown: time.Millisecond}); err == nil {
		t.Fatal("a sub-second cooldown was accepted")
	}
}

// A released address stays out of the pool for the cooldown, then returns.
func TestLeaveCooldown(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	reg, err := registrar.New(srv.Store, registrar.Config{Subnet: "10.100.0.0/30", Cooldown: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A /30 has two usable addresses.
	rep1, err := reg.Register(ctx, store.MeshRegisterRequest{Token: invite(t, srv.Store), Machine: "a", PublicKey: newKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Register(ctx, store.MeshRegisterRequest{Token: invite(t, srv.Store), Machine: "b", PublicKey: newKey(t)}); err != nil {
		t.Fatal(err)
	}
	// Wrong secret: refused, nothing released.
	if _, err := reg.Leave(ctx, store.MeshLeaveRequest{Machine: "a", Secret: "epnode_wrong"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("wrong secret: %v", err)
	}
	if _, err := srv.Store.MeshPeer(ctx, "a"); err != nil {
		t.Fatalf("peer a gone after a refused leave: %v", err)
	}
	if _, err := reg.Leave(ctx, store.MeshLeaveRequest{Machine: "nobody", Secret: "x"}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("unknown machine: %v", err)
	}
	lv, err := reg.Leave(ctx, store.MeshLeaveRequest{Machine: "a", Secret: rep1.Secret})
	if err != nil || lv.ReleasedIP != rep1.MeshIP {
		t.Fatalf("leave: %+v %v", lv, err)
	}
	if _, err := srv.Store.MeshPeer(ctx, "a"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("peer a still there: %v", err)
	}
	// During the cooldown the pool is exhausted.
	_, err = reg.Register(ctx, store.MeshRegisterRequest{Token: invite(t, srv.Store), Machine: "c", PublicKey: newKey(t)})
	if !store.HasCode(err, store.CodeUnavailable) {
		t.Fatalf("register during cooldown: %v, want unavailable", err)
	}
	// After it, c gets a's old address.
	var got string
	storetest.Eventually(t, 10*time.Second, "address back in the pool", func() bool {
		rep, err := reg.Register(ctx, store.MeshRegisterRequest{Token: invite(t, srv.Store), Machine: "c", PublicKey: newKey(t)})
		if err != nil {
			return false
		}
		got = rep.MeshIP
		return true
	})
	if got != rep1.MeshIP {
		t.Fatalf("c got %s, want the cooled-down %s", got, rep1.MeshIP)
	}
}

// Unknown commands and undecodable requests over NATS are structured errors.
func TestServeBadRequests(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	stop, err := registrar.Serve(ctx, srv.Store, registrar.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	err = store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject("explode"), "registrar", "explode", map[string]int{}, nil)
	if !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("unknown command: %v", err)
	}
	msg, err := srv.Store.NC.Request(srv.Store.Names.RegistrarSubject("register"), []byte("{not json"), 5*time.Second)
	if err != nil || !contains(string(msg.Data), "invalid") {
		t.Fatalf("garbage request: %s %v", msg.Data, err)
	}

	// The machine-bound subjects (the only ones mesh credentials may
	// publish to) take requests for that machine only.
	tok := invite(t, srv.Store)
	req := store.MeshRegisterRequest{Token: tok, Machine: "m2", PublicKey: newKey(t)}
	for _, subj := range []string{"register.m1", "register.a.b"} {
		err = store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject(subj), "registrar", "register", req, nil)
		if !store.HasCode(err, store.CodeInvalid) {
			t.Fatalf("%s for m2: %v", subj, err)
		}
	}
	if _, err := srv.Store.MeshPeer(ctx, "m2"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a refused request wrote m2's peer record: %v", err)
	}
	var rep store.MeshRegisterReply
	if err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject("register.m2"), "registrar", "register", req, &rep); err != nil {
		t.Fatalf("register.m2 for m2 (the invite must be unspent): %v", err)
	}
	lreq := store.MeshLeaveRequest{Machine: "m2", Secret: rep.Secret}
	if err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject("leave.m1"), "registrar", "leave", lreq, nil); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("leave.m1 for m2: %v", err)
	}
	if err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject("leave.m2"), "registrar", "leave", lreq, nil); err != nil {
		t.Fatalf("leave.m2 for m2: %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A node is told the preshared keys of its own pairs only, the same key
// each side of a pair; it must hold its node secret; static peers and
// unknown machines get none; only the machine-bound subject answers.
func TestPresharedKeysPerPair(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	r := serve(t, srv.Store, registrar.Config{})
	secrets := registered(t, srv.Store, "m1", "m2", "m3")
	if _, err := r.AddStatic(ctx, "plainwg", newKey(t), []string{"192.0.2.9:51820"}); err != nil {
		t.Fatal(err)
	}
	ask := func(machine, secret string, peers ...string) (map[string]string, error) {
		var rep store.MeshPSKReply
		err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject("psk."+machine), "registrar", "psk",
			store.MeshPSKRequest{Machine: machine, Secret: secret, Peers: peers}, &rep)
		return rep.PSKs, err
	}
	k1, err := ask("m1", secrets["m1"], "m2", "m3", "plainwg", "ghost", "m1")
	if err != nil {
		t.Fatal(err)
	}
	if len(k1) != 2 || k1["m2"] == "" || k1["m3"] == "" || k1["m2"] == k1["m3"] {
		t.Fatalf("m1's keys: %v (want m2's and m3's, different)", k1)
	}
	k2, err := ask("m2", secrets["m2"], "m1", "m3")
	if err != nil {
		t.Fatal(err)
	}
	if k2["m1"] != k1["m2"] {
		t.Fatal("m1 and m2 were told different keys for their pair")
	}
	if k2["m3"] == k1["m3"] || k2["m3"] == k1["m2"] {
		t.Fatal("a pair's key repeats another pair's")
	}
	// The pair key is the derivation from the stored secret, and a second
	// registrar (another control server) derives the same.
	secret, err := srv.Connect(t).MeshPSKSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := registrar.PSK(secret, "m2", "m1")
	if k1["m2"] != base64.StdEncoding.EncodeToString(want[:]) {
		t.Fatal("the pair key is not the derivation from the mesh key secret")
	}
	for _, tc := range []struct {
		what, subject, machine, secret string
	}{
		{"a wrong node secret", "psk.m1", "m1", secrets["m2"]},
		{"no node secret", "psk.m1", "m1", ""},
		{"another machine's subject", "psk.m3", "m1", secrets["m1"]},
		{"the unbound subject", "psk", "m1", secrets["m1"]},
	} {
		var rep store.MeshPSKReply
		err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject(tc.subject), "registrar", "psk",
			store.MeshPSKRequest{Machine: tc.machine, Secret: tc.secret, Peers: []string{"m2"}}, &rep)
		if !store.HasCode(err, store.CodeInvalid) || len(rep.PSKs) != 0 {
			t.Fatalf("%s: %v %v", tc.what, rep.PSKs, err)
		}
	}
	if _, err := ask("plainwg", "", "m1"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a static peer asking: %v", err)
	}
	many := make([]string, store.MaxPSKPeers+1)
	for i := range many {
		many[i] = fmt.Sprintf("p%d", i)
	}
	if _, err := ask("m1", secrets["m1"], many...); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("%d peers: %v", len(many), err)
	}
}

// A node rotates its key on its own subject with its node secret: the
// record carries the new key and the old one until the overlap ends, a
// retry with the same key changes nothing, and every bad request is refused
// with the record left as it was.
func TestRotateKey(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	r := serve(t, srv.Store, registrar.Config{})
	secrets := registered(t, srv.Store, "m1", "m2")
	keys := map[string]string{}
	for _, m := range []string{"m1", "m2"} {
		rec, err := srv.Store.MeshPeer(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		keys[m] = rec.PublicKey
	}
	static := newKey(t)
	if _, err := r.AddStatic(ctx, "plainwg", static, []string{"192.0.2.9:51820"}); err != nil {
		t.Fatal(err)
	}
	rotate := func(subject string, req store.MeshRotateRequest) (*store.MeshRotateReply, error) {
		var rep store.MeshRotateReply
		err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject(subject), "registrar", "rotate", req, &rep)
		return &rep, err
	}

	// Asked for by an operator: the record says so, and only a meshd
	// node's can.
	asked, err := r.RequestRotation(ctx, "m1")
	if err != nil || !asked.RotationDue() {
		t.Fatalf("request: %+v %v", asked, err)
	}
	if _, err := r.RequestRotation(ctx, "plainwg"); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("rotating a static peer: %v", err)
	}
	if _, err := r.RequestRotation(ctx, "ghost"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("rotating an unknown machine: %v", err)
	}

	next := newKey(t)
	for _, tc := range []struct {
		what, subject string
		req           store.MeshRotateRequest
		code          string
	}{
		{"a wrong node secret", "rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m2"], PublicKey: next}, store.CodeInvalid},
		{"another machine's subject", "rotate.m2", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: next}, store.CodeInvalid},
		{"the unbound subject", "rotate", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: next}, store.CodeInvalid},
		{"a malformed key", "rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: "nope"}, store.CodeInvalid},
		{"another machine's key", "rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: keys["m2"]}, store.CodeConflict},
		{"a static peer's key", "rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: static}, store.CodeConflict},
		{"an overlap too long", "rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: next,
			Overlap: store.Duration(48 * time.Hour)}, store.CodeInvalid},
		{"a static peer asking", "rotate.plainwg", store.MeshRotateRequest{Machine: "plainwg", PublicKey: next}, store.CodeNotFound},
	} {
		if _, err := rotate(tc.subject, tc.req); !store.HasCode(err, tc.code) {
			t.Fatalf("%s: %v, want %s", tc.what, err, tc.code)
		}
		rec, err := srv.Store.MeshPeer(ctx, "m1")
		if err != nil || rec.PublicKey != keys["m1"] || rec.PreviousKey != "" {
			t.Fatalf("%s changed the record: %+v %v", tc.what, rec, err)
		}
	}

	req := store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"], PublicKey: next, Overlap: store.Duration(time.Minute)}
	rep, err := rotate("rotate.m1", req)
	if err != nil {
		t.Fatal(err)
	}
	rec := rep.Record
	if rec.PublicKey != next || rec.PreviousKey != keys["m1"] || !rec.PreviousValid(time.Now()) ||
		rec.PreviousValid(time.Now().Add(time.Minute+time.Second)) || rec.RotationDue() {
		t.Fatalf("rotated record: %+v", rec)
	}
	stored, err := srv.Store.MeshPeer(ctx, "m1")
	if err != nil || stored.PublicKey != next || stored.PreviousKey != keys["m1"] {
		t.Fatalf("stored record: %+v %v", stored, err)
	}
	// A retry (the reply was lost) leaves the overlap as it was.
	again, err := rotate("rotate.m1", req)
	if err != nil || !again.Record.PreviousUntil.Equal(rec.PreviousUntil) || again.Record.PreviousKey != keys["m1"] {
		t.Fatalf("retry: %+v %v", again, err)
	}
	// Neither key of m1 can be taken by another machine while the old one
	// is still accepted.
	for _, k := range []string{next, keys["m1"]} {
		if _, err := rotate("rotate.m2", store.MeshRotateRequest{Machine: "m2", Secret: secrets["m2"], PublicKey: k}); !store.HasCode(err, store.CodeConflict) {
			t.Fatalf("m2 taking m1's key: %v", err)
		}
	}
}

// A node gets the relays and TURN credentials in its own name, on its own
// subject with its node secret; the credentials work on a relay that checks
// them against the store's relay secret.
func TestRelayCredentials(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	secret, err := srv.Store.MeshRelaySecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs := relaytest.Start(t, secret)
	serve(t, srv.Store, registrar.Config{Relays: []string{rs.Addr().String()}})
	secrets := registered(t, srv.Store, "m1", "m2")
	ask := func(subject string, req store.MeshRelayRequest) (*store.MeshRelayReply, error) {
		var rep store.MeshRelayReply
		err := store.Call(ctx, srv.Store.NC, srv.Store.Names.RegistrarSubject(subject), "registrar", "relay", req, &rep)
		return &rep, err
	}
	rep, err := ask("relay.m1", store.MeshRelayRequest{Machine: "m1", Secret: secrets["m1"]})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Servers) != 1 || rep.Servers[0] != rs.Addr().String() || !strings.HasSuffix(rep.Username, ":m1") ||
		time.Until(rep.Expires) < store.MeshRelayCredentialTTL-time.Minute {
		t.Fatalf("reply: %+v", rep)
	}
	a, err := relay.Allocate(ctx, relay.ClientConfig{Server: rep.Servers[0], Username: rep.Username, Password: rep.Password, Local: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("allocating with the registrar's credentials: %v", err)
	}
	a.Close()
	for _, tc := range []struct {
		what, subject string
		req           store.MeshRelayRequest
		code          string
	}{
		{"a wrong node secret", "relay.m1", store.MeshRelayRequest{Machine: "m1", Secret: secrets["m2"]}, store.CodeInvalid},
		{"another machine's subject", "relay.m2", store.MeshRelayRequest{Machine: "m1", Secret: secrets["m1"]}, store.CodeInvalid},
		{"the unbound subject", "relay", store.MeshRelayRequest{Machine: "m1", Secret: secrets["m1"]}, store.CodeInvalid},
		{"an unknown machine", "relay.ghost", store.MeshRelayRequest{Machine: "ghost"}, store.CodeNotFound},
	} {
		if rep, err := ask(tc.subject, tc.req); !store.HasCode(err, tc.code) || rep.Password != "" {
			t.Fatalf("%s: %+v %v, want %s", tc.what, rep, err, tc.code)
		}
	}
	// Without relays a node is told so, and gets no credentials.
	bare, err := registrar.New(srv.Store, registrar.Config{})
	if err != nil {
		t.Fatal(err)
	}
	none, err := bare.RelayCredentials(ctx, store.MeshRelayRequest{Machine: "m1", Secret: secrets["m1"]})
	if err != nil || len(none.Servers) != 0 || none.Password != "" {
		t.Fatalf("no relays: %+v %v", none, err)
	}
}
