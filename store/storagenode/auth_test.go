package storagenode_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func writeCreds(t *testing.T, a *storagenode.Auth, r storagenode.CredsRequest) string {
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
	_, err := storagenode.Start(storagenode.Config{DataDir: t.TempDir(), Listen: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "without credentials") {
		t.Fatalf("want a refusal, got %v", err)
	}
	_, err = storagenode.Start(storagenode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0",
		Cluster: &storagenode.ClusterConfig{Name: "c", Listen: "0.0.0.0:0"}})
	if err == nil || !strings.Contains(err.Error(), "cluster secret") {
		t.Fatalf("want a refusal of the open cluster port, got %v", err)
	}
	if _, err := storagenode.LoadAuth(t.TempDir(), false); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("empty auth dir: %v", err)
	}
	if _, err := storagenode.RolePermissions(storagenode.RoleAgent, "", store.Names{Installation: "local", Authority: "default"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("agent creds without a machine: %v", err)
	}
	if _, err := storagenode.RolePermissions(storagenode.RoleGateway, "", store.Names{Installation: "local", Authority: "default"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("gateway creds without a name: %v", err)
	}
	if _, err := storagenode.RolePermissions("root", "", store.Names{Installation: "local", Authority: "default"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("unknown role: %v", err)
	}
}

func TestRoleScopedCredentials(t *testing.T) {
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	// Reloading the same dir yields the same trust.
	if _, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), false); err != nil {
		t.Fatal(err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: auth})
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
	ctl := connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleControl}))
	cs, err := store.Provision(ctx, ctl, names, store.Layout{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signers.Server(ctx, cs, filepath.Join(dir, "auth"), dir, "test"); err != nil {
		t.Fatal(err)
	}
	csCerts := storetest.Bucket(t, cs, cs.Names.CertsBucket())
	if _, err := csCerts.Put(ctx, "cert.shop.example.com.key", []byte("PRIVATE KEY")); err != nil {
		t.Fatal(err)
	}

	agentNC := connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"}))
	as, err := store.Open(ctx, agentNC, names)
	if err != nil {
		t.Fatalf("agent binds the store: %v", err)
	}
	// Even holding a signer's key (stolen with the box), its credentials
	// refuse it every write of intent.
	stolen, err := signing.ReadKeyFile(filepath.Join(dir, signers.SignerFile))
	if err != nil {
		t.Fatal(err)
	}
	as.SignWith(store.StaticSigner{Key: stolen})
	// It writes its own machine's instance records...
	asInstances := storetest.Bucket(t, as, as.Names.InstancesBucket())
	if _, err := asInstances.Put(ctx, store.InstanceKey("shop", "m1", "i1"), []byte(`{"version":1}`)); err != nil {
		t.Fatalf("agent instance write: %v", err)
	}
	if err := asInstances.Delete(ctx, store.InstanceKey("shop", "m1", "i1")); err != nil {
		t.Fatalf("agent instance delete: %v", err)
	}
	// ...but no machine record, not even its own (admission goes through
	// the control plane), nor another machine's, and never reads
	// certificates.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }
	// A refused publish gets no JetStream answer; the server reports the
	// violation asynchronously, which ends the wait at once.
	violations := make(chan error, 16)
	agentNC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	})
	refusedOn := func(violations chan error, what, key string, do func(context.Context) error) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- do(c) }()
		for {
			select {
			case v := <-violations:
				// Earlier probes' violations may still be queued.
				if !strings.Contains(v.Error(), "Permissions Violation") || !strings.Contains(v.Error(), "."+key+`"`) {
					continue
				}
				cancel()
				<-done
				return
			case err := <-done:
				if err == nil {
					t.Fatalf("the credentials could %s", what)
				}
				t.Fatalf("%s: refused without a permissions violation: %v", what, err)
			}
		}
	}
	refusedWrite := func(what, key string, do func(context.Context) error) {
		t.Helper()
		refusedOn(violations, what, key, do)
	}
	asMachines := storetest.Bucket(t, as, as.Names.MachinesBucket())
	for _, m := range []string{"m1", "m2"} {
		refusedWrite("write machine "+m+"'s record", m, func(c context.Context) error {
			_, err := asMachines.Put(c, m, []byte(`{"version":1}`))
			return err
		})
	}
	// Nor the store's floor (it would let processes too old for the store
	// run, or refuse every one) or a control server's announcement: agents
	// read the floor only.
	asMeta := storetest.Bucket(t, as, as.Names.MetaBucket())
	for _, key := range []string{"floor", store.ServerKey("s1")} {
		refusedWrite("write "+key+" in the meta bucket", key, func(c context.Context) error {
			_, err := asMeta.Put(c, key, []byte(`{"version":1,"min_generation":1}`))
			return err
		})
	}
	// Nor another machine's instance records, nor keys outside the
	// layout, nor a delete of one (a delete is a write with a header).
	m2Key := store.InstanceKey("shop", "m2", "i2")
	csInstances := storetest.Bucket(t, cs, cs.Names.InstancesBucket())
	if _, err := csInstances.Put(ctx, m2Key, []byte(`{"version":1}`)); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, w := range []struct {
		what, key string
		do        func(context.Context) error
	}{
		{"put m2's instance", m2Key, func(c context.Context) error {
			_, err := asInstances.Put(c, m2Key, []byte(`{"version":1,"state":"failed"}`))
			return err
		}},
		{"create an instance on m2", "shop.m2.i9", func(c context.Context) error {
			_, err := asInstances.Create(c, "shop.m2.i9", []byte(`{"version":1}`))
			return err
		}},
		{"delete m2's instance", m2Key, func(c context.Context) error { return asInstances.Delete(c, m2Key) }},
		{"purge m2's instance", m2Key, func(c context.Context) error { return asInstances.Purge(c, m2Key) }},
		{"put a key without a machine", "shop.i3", func(c context.Context) error {
			_, err := asInstances.Put(c, "shop.i3", []byte(`{"version":1}`))
			return err
		}},
		{"put shop.m2.m1 (machine token m2)", "shop.m2.m1", func(c context.Context) error {
			_, err := asInstances.Put(c, "shop.m2.m1", []byte(`{"version":1}`))
			return err
		}},
	} {
		refusedWrite(w.what, w.key, w.do)
		refused++
	}
	if ent, err := csInstances.Get(ctx, m2Key); err != nil || string(ent.Value()) != `{"version":1}` {
		t.Fatalf("m2's instance record changed: %v", err)
	}
	t.Logf("agent m1's writes to other machines' instance records: %d refused, 0 landed", refused)
	c2, cancel2 := short()
	defer cancel2()
	asCerts := storetest.Bucket(t, as, as.Names.CertsBucket())
	if ent, err := asCerts.Get(c2, "cert.shop.example.com.key"); err == nil {
		t.Fatalf("agent read a certificate: %q", ent.Value())
	}
	c3, cancel3 := short()
	defer cancel3()
	if w, err := asCerts.WatchAll(c3); err == nil {
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

	// It reads its own machine's mesh peer record, not another's.
	agentNC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	})
	csMeshPeers := storetest.Bucket(t, cs, cs.Names.MeshPeersBucket())
	if _, err := csMeshPeers.Put(ctx, store.MeshPeerKey("m1"), []byte(`{"version":1,"machine":"m1"}`)); err != nil {
		t.Fatal(err)
	}
	asMeshPeers := storetest.Bucket(t, as, as.Names.MeshPeersBucket())
	if _, err := asMeshPeers.Get(ctx, store.MeshPeerKey("m1")); err != nil {
		t.Fatalf("agent m1 reading its mesh peer record: %v", err)
	}
	refusedWrite("read m2's mesh peer record", store.MeshPeerKey("m2"), func(c context.Context) error {
		_, err := asMeshPeers.Get(c, store.MeshPeerKey("m2"))
		return err
	})

	// It cannot publish a routing event, not even for a service it runs: it
	// asks the control plane to republish from stored state (what the
	// control plane then publishes: control/routing's
	// TestAgentAsksForARepublish), and only on its own machine's subject.
	refusedWrite("publish a routing upsert", "routing.svc.shop.web", func(c context.Context) error {
		_, err := as.PublishRouting(c, "", []store.RoutingEvent{{Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
			Endpoints: []store.Endpoint{{InstanceID: "forged", Machine: "m1", Address: "203.0.113.9", Port: 80}}}})
		return err
	})
	refusedWrite("ask for a republish as m2", "republish.m2", func(c context.Context) error {
		_, err := as.RequestRepublish(c, "m2", "shop", "web")
		return err
	})

	// The gateway role reads certificates and takes certificate locks, but
	// no deploy or subnet lock.
	gwNC := connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw0"}))
	gwViolations := make(chan error, 16)
	gwNC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case gwViolations <- err:
		default:
		}
	})
	gs, err := store.Open(ctx, gwNC, names)
	if err != nil {
		t.Fatal(err)
	}
	gsCerts := storetest.Bucket(t, gs, gs.Names.CertsBucket())
	if ent, err := gsCerts.Get(ctx, "cert.shop.example.com.key"); err != nil || string(ent.Value()) != "PRIVATE KEY" {
		t.Fatalf("gateway cert read: %v", err)
	}
	lease, err := gs.AcquireLease(ctx, store.CertLockKey("shop.example.com"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "gw1"})
	if err != nil {
		t.Fatalf("gateway certificate lock: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{store.DeployLockKey("shop"), store.SubnetLockKey("10.100.0.0/16")} {
		refusedOn(gwViolations, "take lock "+key, key, func(c context.Context) error {
			_, err := gs.AcquireLease(c, key, store.LeaseOptions{TTL: 5 * time.Second, Holder: "gw1"})
			return err
		})
	}
	// The gateway reads the control plane's machine liveness judgement,
	// and follows it as the bucket republishes it, to set aside a machine
	// that stopped beating; it can neither write one, nor forge a
	// republished one, nor write a heartbeat (any of which would keep a
	// dead machine in its and other gateways' rotation, or take a live
	// one out).
	if err := cs.PutLiveness(ctx, &store.LivenessRecord{At: time.Now()}); err != nil {
		t.Fatalf("the control plane's liveness judgement: %v", err)
	}
	if r, err := gs.Liveness(ctx); err != nil || r == nil {
		t.Fatalf("gateway reading the liveness judgement: %v", err)
	}
	if _, err := gwNC.SubscribeSync(names.MachineLivenessRepublishedWildcard()); err != nil {
		t.Fatal(err)
	}
	gsMeta := storetest.Bucket(t, gs, gs.Names.MetaBucket())
	refusedOn(gwViolations, "write the store's floor", "floor", func(c context.Context) error {
		_, err := gsMeta.Put(c, "floor", []byte(`{"version":1,"min_generation":1}`))
		return err
	})
	refusedOn(gwViolations, "write the liveness judgement", store.LivenessKey, func(c context.Context) error {
		return gs.PutLiveness(c, &store.LivenessRecord{At: time.Now(), Down: map[string]store.MachineDown{"m1": {Liveness: store.MachineOffline}}})
	})
	refusedOn(gwViolations, "write m1's heartbeat", "m1", func(c context.Context) error {
		return gs.PutMachineBeat(c, "m1", time.Second)
	})
	refusedWrite("write the liveness judgement", store.LivenessKey, func(c context.Context) error {
		return as.PutLiveness(c, &store.LivenessRecord{At: time.Now()})
	})
	// The agent writes its own machine's instance observations and no
	// other machine's; the gateway writes none.
	if _, err := as.PutObserved(ctx, &store.MachineObserved{Machine: "m1"}); err != nil {
		t.Fatalf("agent writing its own instance observations: %v", err)
	}
	refusedWrite("write m2's instance observations", "m2", func(c context.Context) error {
		_, err := as.PutObserved(c, &store.MachineObserved{Machine: "m2"})
		return err
	})
	refusedOn(gwViolations, "write m1's instance observations", "m1", func(c context.Context) error {
		_, err := gs.PutObserved(c, &store.MachineObserved{Machine: "m1"})
		return err
	})
	forged := "rp.kv." + names.MachineLivenessBucket() + "." + store.LivenessKey
	if err := gwNC.Publish(forged, []byte(`{"version":1,"down":{"m2":{"liveness":"offline"}}}`)); err != nil {
		t.Fatal(err)
	}
	if err := gwNC.Flush(); err != nil {
		t.Fatal(err)
	}
	for refused := false; !refused; {
		select {
		case v := <-gwViolations:
			// Earlier probes' violations may still be queued.
			refused = strings.Contains(v.Error(), "Permissions Violation") && strings.Contains(v.Error(), forged)
		case <-time.After(5 * time.Second):
			t.Fatal("the gateway published a republished liveness judgement unrefused")
		}
	}
	// A named gateway writes its own traffic report and no other
	// gateway's; an agent writes none.
	gw1NC := connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw1"}))
	gw1Violations := make(chan error, 16)
	gw1NC.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case gw1Violations <- err:
		default:
		}
	})
	gw1, err := store.Open(ctx, gw1NC, names)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw1.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: "gw1", At: time.Now()}); err != nil {
		t.Fatalf("gateway gw1's own traffic report: %v", err)
	}
	// Nor does a gateway vouch for routing events: a seal it files, even
	// one its own key signed, is refused by the server.
	refusedOn(gw1Violations, "file a routing seal", "routing.seal", func(c context.Context) error {
		m := nats.NewMsg(names.RoutingSealSubject())
		m.Data = []byte(`{"version":1,"first":1,"digests":[]}`)
		_, err := gw1.JS.PublishMsg(c, m)
		return err
	})
	refusedOn(gw1Violations, "write gw2's traffic report", "gw2", func(c context.Context) error {
		return gw1.PutGatewayTraffic(c, &store.GatewayTraffic{Gateway: "gw2", At: time.Now()})
	})
	refusedWrite("write a gateway's traffic report", "gw1", func(c context.Context) error {
		return as.PutGatewayTraffic(c, &store.GatewayTraffic{Gateway: "gw1", At: time.Now()})
	})
	// The canary cookie key: the control plane made it with the store; a
	// gateway reads it (to sign and check bucket cookies) and cannot
	// replace it; an agent cannot even read it (it could forge cookies).
	ck, err := cs.CanaryCookieKeyOf(ctx)
	if err != nil || ck == nil {
		t.Fatalf("the canary cookie key after provisioning: %+v %v", ck, err)
	}
	if got, err := gw1.CanaryCookieKeyOf(ctx); err != nil || got == nil || !bytes.Equal(got.Key, ck.Key) {
		t.Fatalf("gateway reading the canary cookie key: %+v %v", got, err)
	}
	gw1CanaryKeys := storetest.Bucket(t, gw1, gw1.Names.CanaryKeysBucket())
	refusedOn(gw1Violations, "write the canary cookie key", store.CanaryCookieKeyName, func(c context.Context) error {
		_, err := gw1CanaryKeys.Put(c, store.CanaryCookieKeyName, []byte(`{"version":1,"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
		return err
	})
	refusedWrite("read the canary cookie key", store.CanaryCookieKeyName, func(c context.Context) error {
		_, err := as.CanaryCookieKeyOf(c)
		return err
	})
	if got, err := cs.CanaryCookieKeyOf(ctx); err != nil || got == nil || !bytes.Equal(got.Key, ck.Key) {
		t.Fatalf("the canary cookie key changed: %+v %v", got, err)
	}
	// Dashboard login tokens are the control role's alone: no edge role
	// reads even their hashes, nor plants one.
	asCredentials := storetest.Bucket(t, as, as.Names.CredentialsBucket())
	gsCredentials := storetest.Bucket(t, gs, gs.Names.CredentialsBucket())
	asDashboardSessions := storetest.Bucket(t, as, as.Names.DashboardSessionsBucket())
	gsDashboardSessions := storetest.Bucket(t, gs, gs.Names.DashboardSessionsBucket())
	asDashboardTokens := storetest.Bucket(t, as, as.Names.DashboardTokensBucket())
	gsDashboardTokens := storetest.Bucket(t, gs, gs.Names.DashboardTokensBucket())
	rec := &store.DashboardToken{Version: store.RecordVersion, ID: "0a1b2c3d4e5f", Name: "ops", Hash: strings.Repeat("00", 32), CreatedAt: time.Now().UTC()}
	if err := cs.PutDashboardToken(ctx, rec); err != nil {
		t.Fatal(err)
	} else {
		refusedOn(gwViolations, "read a dashboard token", rec.ID, func(c context.Context) error {
			_, err := gsDashboardTokens.Get(c, rec.ID)
			return err
		})
		refusedWrite("read a dashboard token", rec.ID, func(c context.Context) error {
			_, err := asDashboardTokens.Get(c, rec.ID)
			return err
		})
		refusedWrite("plant a dashboard token", "planted", func(c context.Context) error {
			_, err := asDashboardTokens.Put(c, "planted", []byte(`{"version":1,"id":"planted","hash":"00"}`))
			return err
		})
		// Nor read a session (even its hashed key) or plant one.
		sess := &store.DashboardSession{Version: store.RecordVersion, Key: strings.Repeat("ab", 32), Token: rec.ID, CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Hour).UTC()}
		if err := cs.PutDashboardSessionRecord(ctx, sess, time.Hour); err != nil {
			t.Fatal(err)
		} else {
			refusedOn(gwViolations, "read a dashboard session", sess.Key, func(c context.Context) error {
				_, err := gsDashboardSessions.Get(c, sess.Key)
				return err
			})
			refusedWrite("plant a dashboard session", "planted", func(c context.Context) error {
				_, err := asDashboardSessions.Put(c, "planted", []byte(`{"version":1,"key":"planted","token":"x"}`))
				return err
			})
		}
		// The record of issued keys is the control plane's: no edge role
		// reads who holds what, or plants a key that machine rm would
		// then not revoke (or revoke one it should not).
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		if err := cs.RecordCredential(ctx, &store.CredentialRecord{User: upub, Role: storagenode.RoleAgent, Machine: "m1",
			How: store.IssuedByCommand, IssuedAt: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
		refusedOn(gwViolations, "read an issued key's record", upub, func(c context.Context) error {
			_, err := gsCredentials.Get(c, upub)
			return err
		})
		refusedWrite("plant an issued key's record", upub, func(c context.Context) error {
			_, err := asCredentials.Put(c, upub, []byte(`{"version":1,"user":"`+upub+`","role":"agent","machine":"m2"}`))
			return err
		})
	}
	// Releases: an agent reads the signed records and fetches the
	// binaries to upgrade its box, and cannot push one, even holding a
	// signer's key, nor change a stored binary's bytes.
	// Larger than the edge account's largest publish and than one object
	// store chunk: an agent still reads it whole.
	binary := "#!/bin/sh\n" + strings.Repeat("# padding\n", 40_000)
	if err := cs.PushRelease(ctx, &store.ReleaseRecord{Release: "1.2.0", Arch: "linux/amd64"},
		map[string]io.Reader{"control": strings.NewReader(binary)}); err != nil {
		t.Fatal(err)
	}
	rel, err := as.Release(ctx, "1.2.0", "linux/amd64")
	if err != nil {
		t.Fatalf("agent reads a release: %v", err)
	}
	var fetched bytes.Buffer
	if err := as.FetchReleaseBinary(ctx, rel, "control", &fetched); err != nil || fetched.String() != binary {
		t.Fatalf("agent fetches a release binary: %d bytes, %v", fetched.Len(), err)
	}
	asReleases := storetest.Bucket(t, as, as.Names.ReleasesBucket())
	refusedWrite("write a release record", store.ReleaseKey("9.9.9", "linux/amd64"), func(c context.Context) error {
		_, err := asReleases.Put(c, store.ReleaseKey("9.9.9", "linux/amd64"), []byte(`{"version":1}`))
		return err
	})
	for what, push := range map[string]func(context.Context) error{
		"push a release": func(c context.Context) error {
			return as.PushRelease(c, &store.ReleaseRecord{Release: "9.9.9", Arch: "linux/amd64"}, map[string]io.Reader{"control": strings.NewReader("evil")})
		},
		"overwrite a release binary": func(c context.Context) error {
			obs, err := as.JS.ObjectStore(c, names.ReleaseBinariesStore())
			if err != nil {
				return err
			}
			_, err = obs.Put(c, jetstream.ObjectMeta{Name: rel.Binaries["control"].Object}, strings.NewReader("evil"))
			return err
		},
	} {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := push(c)
		cancel()
		if err == nil {
			t.Fatalf("agent credentials could %s", what)
		}
	}
	fetched.Reset()
	if err := as.FetchReleaseBinary(ctx, rel, "control", &fetched); err != nil || fetched.String() != binary {
		t.Fatalf("after the attempts, the release binary reads %d bytes, %v", fetched.Len(), err)
	}
	if _, err := as.Release(ctx, "9.9.9", "linux/amd64"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a release the agent pushed exists: %v", err)
	}
	// Upgrades: agent m1's credentials cannot tell another machine to
	// upgrade, nor take the fleet upgrade lease a rollout holds.
	upgrades := make(chan string, 4)
	stopM2, err := store.Serve(ctx, ctl, names.NodeListenSubject("m2"), names.NodeQueueGroup("m2"), "node.m2",
		func(_ context.Context, cmd string, _ []byte) (any, error) {
			upgrades <- cmd
			return store.UpgradeReply{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer stopM2()
	refusedWrite("tell machine m2 to upgrade", store.CmdUpgrade, func(c context.Context) error {
		// Unsigned, as sent: the permissions refuse it before m2 could.
		return store.Call(c, as.NC, names.RPCSubject("m2", store.CmdUpgrade), "m2", store.CmdUpgrade, store.UpgradeRequest{Release: "1.2.0", Attempt: 1}, nil)
	})
	select {
	case cmd := <-upgrades:
		t.Fatalf("machine m2 received %s from agent m1's credentials", cmd)
	default:
	}
	asLocks := storetest.Bucket(t, as, as.Names.LocksBucket())
	refusedWrite("take the fleet upgrade lease", "cp.lock.fleet_upgrade", func(c context.Context) error {
		_, err := store.AcquireLease(c, as.JS, asLocks, "cp.lock.fleet_upgrade", store.LeaseOptions{TTL: 10 * time.Second})
		return err
	})
	gsLocks := storetest.Bucket(t, gs, gs.Names.LocksBucket())
	refusedOn(gwViolations, "take the fleet upgrade lease", "cp.lock.fleet_upgrade", func(c context.Context) error {
		_, err := store.AcquireLease(c, gs.JS, gsLocks, "cp.lock.fleet_upgrade", store.LeaseOptions{TTL: 10 * time.Second})
		return err
	})
	// Nor write a rollout's record (what the dashboard shows of one).
	refusedWrite("write a rollout record", "r1", func(c context.Context) error {
		return as.PutRollout(c, &store.RolloutRecord{ID: "r1", Release: "1.2.0", State: store.RolloutDone, Started: time.Now()})
	})
	refusedOn(gwViolations, "write a rollout record", "r1", func(c context.Context) error {
		return gs.PutRollout(c, &store.RolloutRecord{ID: "r1", Release: "1.2.0", State: store.RolloutDone, Started: time.Now()})
	})
	// Nor decide a canary: promote a bad release, abort a good one.
	for _, action := range []string{store.DecisionPromote, store.DecisionAbort} {
		refusedWrite(action+" a canary", "shop.d2", func(c context.Context) error {
			return as.PutCanaryDecision(c, &store.CanaryDecision{Namespace: "shop", DeployID: "d2", Action: action})
		})
		refusedOn(gwViolations, action+" a canary", "shop.d2", func(c context.Context) error {
			return gs.PutCanaryDecision(c, &store.CanaryDecision{Namespace: "shop", DeployID: "d2", Action: action})
		})
	}
	// Gateways and meshd have no business with releases.
	refusedOn(gwViolations, "read a release", "$KV."+names.ReleasesBucket()+"."+store.ReleaseKey("1.2.0", "linux/amd64"), func(c context.Context) error {
		_, err := gs.Release(c, "1.2.0", "linux/amd64")
		return err
	})
	// Mesh credentials write only their own heartbeat.
	ms, err := store.Open(ctx, connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleMesh, Machine: "m1"})), names)
	if err != nil {
		t.Fatal(err)
	}
	msMeshHeartbeats := storetest.Bucket(t, ms, ms.Names.MeshHeartbeatsBucket())
	if _, err := msMeshHeartbeats.Put(ctx, store.MeshBeatKey("m1"), []byte(`{"version":1}`)); err != nil {
		t.Fatalf("mesh own heartbeat: %v", err)
	}
	c5, cancel5 := short()
	defer cancel5()
	if _, err := msMeshHeartbeats.Put(c5, store.MeshBeatKey("m2"), []byte(`{"version":1}`)); err == nil {
		t.Fatal("mesh m1 wrote m2's heartbeat")
	}
	// Nor do they judge machines or vouch for routing.
	c6, cancel6 := short()
	defer cancel6()
	if err := ms.PutLiveness(c6, &store.LivenessRecord{At: time.Now()}); err == nil {
		t.Fatal("mesh m1 wrote the machine liveness judgement")
	}
	c7, cancel7 := short()
	defer cancel7()
	seal := nats.NewMsg(names.RoutingSealSubject())
	seal.Data = []byte(`{"version":1,"first":1,"digests":[]}`)
	if _, err := ms.JS.PublishMsg(c7, seal); err == nil {
		t.Fatal("mesh m1 filed a routing seal")
	}
}
