package node_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// authCluster is a control plane whose NATS runs in operator mode, as
// `control server --auth` does: every client needs credentials.
type authCluster struct {
	url  string
	auth *storagenode.Auth
	st   *store.Store // control credentials
	dir  string
	stun []string
}

func startAuthCluster(t *testing.T) *authCluster {
	t.Helper()
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	c := &authCluster{url: ns.ClientURL(), auth: auth, dir: dir}
	c.st = c.open(t, c.creds(t, storagenode.RoleControl, ""), true)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for range 2 {
		s, err := stunserver.Listen(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		c.stun = append(c.stun, s.Addr().String())
	}
	stop, err := registrar.Serve(ctx, c.st, registrar.Config{STUN: c.stun, Cooldown: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return c
}

// creds writes credentials for role (and machine) and returns the file.
func (c *authCluster) creds(t *testing.T, role, machine string) string {
	t.Helper()
	b, err := c.auth.IssueCreds(storagenode.CredsRequest{Role: role, Machine: machine})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(c.dir, role+"-"+machine+".creds")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// open connects with creds and provisions (control) or binds the store.
func (c *authCluster) open(t *testing.T, creds string, provision bool) *store.Store {
	t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: c.url, CredsFile: creds, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names, _ := store.NewNames("", "")
	open := store.Open
	if provision {
		open = func(ctx context.Context, nc *nats.Conn, n store.Names) (*store.Store, error) {
			return store.Provision(ctx, nc, n, store.Layout{})
		}
	}
	s, err := open(ctx, nc, names)
	if err != nil {
		t.Fatal(err)
	}
	if provision {
		if _, err := signers.Server(ctx, s, c.auth.Dir, c.dir, "test"); err != nil {
			t.Fatal(err)
		}
	} else {
		anchor, err := store.ResolveAnchor("", creds, "")
		if err != nil {
			t.Fatal(err)
		}
		s.TrustAnchor(anchor)
	}
	return s
}

func (c *authCluster) invite(t *testing.T) string {
	t.Helper()
	tok, _, err := invites.Create(context.Background(), c.st, invites.Spec{Region: "test", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (c *authCluster) join(machine, dir, token, creds string) (*node.State, error) {
	return node.Join(context.Background(), node.JoinOptions{Token: token, DataDir: dir, NATSURL: c.url, CredsFile: creds,
		Machine: machine, Bind: "127.0.0.1", Mode: node.ModeNetstack, Timeout: 20 * time.Second})
}

// TestMeshCredentials runs meshd against a control plane that requires
// credentials. Nodes with mesh credentials for their own machine do
// everything meshd does (register, watch the peers with history, heartbeat,
// read heartbeats, report drift, leave) and reach each other over the mesh;
// another machine's credentials are refused by NATS itself with a message
// that says so, and a refused join or leave changes nothing.
func TestMeshCredentials(t *testing.T) {
	c := startAuthCluster(t)
	ctx := context.Background()
	base := t.TempDir()
	credsA, credsB := c.creds(t, storagenode.RoleMesh, "alpha"), c.creds(t, storagenode.RoleMesh, "beta")

	dirA, dirB := filepath.Join(base, "alpha"), filepath.Join(base, "beta")
	stA, err := c.join("alpha", dirA, c.invite(t), credsA)
	if err != nil {
		t.Fatalf("join alpha with its mesh credentials: %v", err)
	}
	if stA.CredsFile != credsA {
		t.Fatalf("state keeps creds %q, want %q", stA.CredsFile, credsA)
	}
	if _, err := c.join("beta", dirB, c.invite(t), credsB); err != nil {
		t.Fatalf("join beta: %v", err)
	}
	a, b := startNode(t, dirA), startNode(t, dirB)

	// Both watches go live, each sees the other alive (its heartbeats read
	// back), and each node's own heartbeat and drift report land.
	for _, x := range []struct {
		n           *runningNode
		self, other string
	}{{a, "alpha", "beta"}, {b, "beta", "alpha"}} {
		storetest.Eventually(t, 10*time.Second, x.self+" sees "+x.other+" alive over a live watch", func() bool {
			p, ok := x.n.peer(t, x.other)
			s := x.n.status(t)
			return ok && p.Active && p.Liveness == store.LivenessAlive && s.Control.Watch == "live" && s.Control.Connected
		})
		storetest.Eventually(t, 10*time.Second, x.self+"'s heartbeat and drift report", func() bool {
			var hb store.MeshHeartbeat
			var rep store.MeshDriftReport
			_, err1 := store.GetJSON(ctx, storetest.Bucket(t, c.st, c.st.Names.MeshHeartbeatsBucket()), store.MeshBeatKey(x.self), &hb)
			_, err2 := store.GetJSON(ctx, storetest.Bucket(t, c.st, c.st.Names.MeshDriftBucket()), store.MeshDriftKey(x.self), &rep)
			return err1 == nil && err2 == nil && rep.Source == "watch"
		})
	}
	// TCP across the mesh.
	ipB := netip.MustParseAddr(b.State().MeshIP)
	servePong(t, b, ipB)
	storetest.Eventually(t, 20*time.Second, "TCP from alpha to beta over the mesh", func() bool {
		return pongs(ctx, a, ipB)
	})
	// The reads a node falls back on when its watch is down work too.
	ms := c.open(t, credsA, false)
	if peers, err := ms.MeshPeerList(ctx); err != nil || len(peers) != 2 {
		t.Fatalf("mesh peer list with alpha's credentials: %d %v", len(peers), err)
	}
	if beats, err := ms.MeshHeartbeats(ctx); err != nil || len(beats) != 2 {
		t.Fatalf("heartbeats with alpha's credentials: %d %v", len(beats), err)
	}

	// gamma tries to join with alpha's credentials: refused at once by
	// NATS, nothing written, and the invite stays unspent.
	tok := c.invite(t)
	dirG := filepath.Join(base, "gamma")
	_, err = c.join("gamma", dirG, tok, credsA)
	if !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("join gamma with alpha's credentials: want a permissions violation, got %v", err)
	}
	t.Logf("refusal: %v", err)
	for _, want := range []string{"register for machine gamma refused by the control plane, nothing was changed", "machine alpha", "--role mesh --machine gamma", "nothing was changed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
	// Without credentials, or with a file that holds none, likewise.
	_, err = c.join("gamma", dirG, tok, "")
	if err == nil || !strings.Contains(err.Error(), "requires credentials: pass --creds") {
		t.Fatalf("join gamma without credentials: %v", err)
	}
	junk := filepath.Join(base, "junk.creds")
	os.WriteFile(junk, []byte("not credentials\n"), 0o600)
	for _, f := range []string{junk, filepath.Join(base, "missing.creds")} {
		if _, err := c.join("gamma", dirG, tok, f); err == nil || !strings.Contains(err.Error(), "--creds") {
			t.Fatalf("join gamma with --creds %s: %v", f, err)
		}
	}
	if _, err := os.Stat(dirG); !os.IsNotExist(err) {
		t.Fatalf("refused joins wrote %s: %v", dirG, err)
	}
	if _, err := c.st.MeshPeer(ctx, "gamma"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("refused joins wrote gamma's peer record: %v", err)
	}
	if _, err := c.join("gamma", dirG, tok, c.creds(t, storagenode.RoleMesh, "gamma")); err != nil {
		t.Fatalf("join gamma with its own credentials and the same invite: %v", err)
	}

	// beta's credentials cannot take alpha out of the mesh.
	_, err = node.Leave(ctx, node.LeaveOptions{DataDir: dirA, CredsFile: credsB})
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("leave alpha with beta's credentials: %v", err)
	}
	t.Logf("refusal: %v", err)
	if _, err := node.LoadState(dirA); err != nil {
		t.Fatalf("alpha's state after a refused leave: %v", err)
	}
	if _, err := c.st.MeshPeer(ctx, "alpha"); err != nil {
		t.Fatalf("alpha's peer record after a refused leave: %v", err)
	}
	// Its own (saved) credentials can.
	if _, err := node.Leave(ctx, node.LeaveOptions{DataDir: dirA}); err != nil {
		t.Fatalf("leave alpha: %v", err)
	}
	storetest.Eventually(t, 10*time.Second, "alpha gone from beta's config", func() bool {
		_, ok := b.peer(t, "alpha")
		return !ok
	})
	if err := <-a.done; err != nil {
		t.Fatalf("alpha run after leave: %v", err)
	}
	a.done <- nil
}

// Credentials without the fleet CA (issued before TLS, or kept apart from
// it) work with the CA given as a file: join saves it, and leave (like run)
// uses what join saved.
func TestMeshJoinWithCAFile(t *testing.T) {
	c := startAuthCluster(t)
	full, err := os.ReadFile(c.creds(t, storagenode.RoleMesh, "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	cut := bytes.Index(full, []byte(store.BundleHeader))
	if cut < 0 {
		t.Fatal("mesh credentials carry no CA")
	}
	bare := filepath.Join(c.dir, "bare.creds")
	if err := os.WriteFile(bare, full[:cut], 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "alpha")
	if _, err := c.join("alpha", dir, c.invite(t), bare); !errors.Is(err, store.ErrNoFleetCA) {
		t.Fatalf("join with credentials that carry no CA, and no CA file: %v", err)
	}
	caFile := filepath.Join(c.dir, "auth", "tls", "bundle.crt")
	st, err := node.Join(context.Background(), node.JoinOptions{Token: c.invite(t), DataDir: dir, NATSURL: c.url, CredsFile: bare, CAFile: caFile,
		Machine: "alpha", Bind: "127.0.0.1", Mode: node.ModeNetstack, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("join with the CA file: %v", err)
	}
	if st.CAFile != caFile {
		t.Fatalf("state keeps CA file %q, want %q", st.CAFile, caFile)
	}
	if _, err := node.Leave(context.Background(), node.LeaveOptions{DataDir: dir}); err != nil {
		t.Fatalf("leave with the saved CA file: %v", err)
	}
}
