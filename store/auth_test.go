package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
)

func writeCreds(t *testing.T, a *store.Auth, r store.CredsRequest) string {
	t.Helper()
	b, err := a.IssueCreds(r)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), r.Role+r.Machine+".creds")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNonLoopbackListenerNeedsCredentials(t *testing.T) {
	_, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: t.TempDir(), Listen: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "without credentials") {
		t.Fatalf("want a refusal, got %v", err)
	}
	_, err = store.StartEmbedded(store.EmbeddedConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		Cluster: &store.ClusterConfig{Name: "c", Listen: "0.0.0.0:0"}})
	if err == nil || !strings.Contains(err.Error(), "cluster secret") {
		t.Fatalf("want a refusal of the open cluster port, got %v", err)
	}
	if _, err := store.LoadAuth(t.TempDir(), false); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("empty auth dir: %v", err)
	}
	if _, err := store.RolePermissions(store.RoleAgent, "", store.Names{Installation: "local", Authority: "default"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("agent creds without a machine: %v", err)
	}
	if _, err := store.RolePermissions("root", "", store.Names{Installation: "local", Authority: "default"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("unknown role: %v", err)
	}
}

func TestRoleScopedCredentials(t *testing.T) {
	dir := t.TempDir()
	auth, err := store.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	// Reloading the same dir yields the same trust.
	if _, err := store.LoadAuth(filepath.Join(dir, "auth"), false); err != nil {
		t.Fatal(err)
	}
	ns, err := store.StartEmbedded(store.EmbeddedConfig{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	url := ns.ClientURL()
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := store.Connect(store.ConnectOptions{URL: url, Timeout: 2 * time.Second}); err == nil {
		t.Fatal("a connection without credentials was accepted")
	}
	connect := func(creds string) *nats.Conn {
		t.Helper()
		nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: creds})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctl := connect(writeCreds(t, auth, store.CredsRequest{Role: store.RoleControl}))
	cs, err := store.Provision(ctx, ctl, names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Certs.Put(ctx, "cert.shop.example.com.key", []byte("PRIVATE KEY")); err != nil {
		t.Fatal(err)
	}

	agentNC := connect(writeCreds(t, auth, store.CredsRequest{Role: store.RoleAgent, Machine: "m1"}))
	as, err := store.Open(ctx, agentNC, names)
	if err != nil {
		t.Fatalf("agent binds the store: %v", err)
	}
	// It writes instance state and its own machine record...
	if _, err := as.Instances.Put(ctx, "shop.i1", []byte(`{"version":1}`)); err != nil {
		t.Fatalf("agent instance write: %v", err)
	}
	if _, err := as.Machines.Put(ctx, "m1", []byte(`{"version":1}`)); err != nil {
		t.Fatalf("agent own machine write: %v", err)
	}
	// ...but not another machine's, and never reads certificates.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	c1, cancel1 := short()
	defer cancel1()
	if _, err := as.Machines.Put(c1, "m2", []byte(`{"version":1}`)); err == nil {
		t.Fatal("agent m1 wrote machine m2's record")
	}
	c2, cancel2 := short()
	defer cancel2()
	if ent, err := as.Certs.Get(c2, "cert.shop.example.com.key"); err == nil {
		t.Fatalf("agent read a certificate: %q", ent.Value())
	}
	c3, cancel3 := short()
	defer cancel3()
	if w, err := as.Certs.WatchAll(c3); err == nil {
		select {
		case ent := <-w.Updates():
			if ent != nil {
				t.Fatalf("agent watched a certificate: %q", ent.Value())
			}
		case <-c3.Done():
		}
		w.Stop()
	}
	// A core subscription on the bucket's subjects is refused too.
	errc := make(chan error, 4)
	agentNC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errc <- err })
	if _, err := agentNC.Subscribe("$KV."+names.CertsBucket()+".>", func(*nats.Msg) {}); err == nil {
		select {
		case err := <-errc:
			if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("cert subscription: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("agent subscribed to certificate subjects without a permissions error")
		}
	}
	// It answers its own RPC subject but cannot take another machine's.
	stop, err := store.Serve(ctx, agentNC, names.NodeListenSubject("m1"), names.NodeQueueGroup("m1"), "node.m1",
		func(context.Context, string, []byte) (any, error) { return map[string]string{"ok": "m1"}, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var rep map[string]string
	if err := cs.Call(ctx, "m1", store.CmdCapacity, store.CapacityRequest{}, &rep); err != nil || rep["ok"] != "m1" {
		t.Fatalf("own RPC: %v %v", rep, err)
	}
	if _, err := store.Serve(ctx, agentNC, names.NodeListenSubject("m2"), names.NodeQueueGroup("m2"), "node.m2",
		func(context.Context, string, []byte) (any, error) { return "hijacked", nil }); err == nil {
		select {
		case err := <-errc:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Fatalf("m2 subscription: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("no permissions error for subscribing to m2's RPC subject")
		}
	}
	c4, cancel4 := short()
	defer cancel4()
	if err := cs.Call(c4, "m2", store.CmdCapacity, store.CapacityRequest{}, nil); !store.HasCode(err, store.CodeRPCFailure) {
		t.Fatalf("a call to m2 must find no responder, got %v", err)
	}

	// The gateway role reads certificates.
	gs, err := store.Open(ctx, connect(writeCreds(t, auth, store.CredsRequest{Role: store.RoleGateway})), names)
	if err != nil {
		t.Fatal(err)
	}
	if ent, err := gs.Certs.Get(ctx, "cert.shop.example.com.key"); err != nil || string(ent.Value()) != "PRIVATE KEY" {
		t.Fatalf("gateway cert read: %v", err)
	}
	// Mesh credentials write only their own heartbeat.
	ms, err := store.Open(ctx, connect(writeCreds(t, auth, store.CredsRequest{Role: store.RoleMesh, Machine: "m1"})), names)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.MeshBeats.Put(ctx, store.MeshBeatKey("m1"), []byte(`{"version":1}`)); err != nil {
		t.Fatalf("mesh own heartbeat: %v", err)
	}
	c5, cancel5 := short()
	defer cancel5()
	if _, err := ms.MeshBeats.Put(c5, store.MeshBeatKey("m2"), []byte(`{"version":1}`)); err == nil {
		t.Fatal("mesh m1 wrote m2's heartbeat")
	}
}
