package integration

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The trust boundary, attacked with the credentials a thief takes from an
// edge box: each subtest is one attack, run with the real
// credentials `control creds issue` wrote against `control server --auth
// on`, with a real gateway (the custom Caddy with gateway credentials,
// serving HTTP, DNS and on-demand TLS) in front of a real deploy. After
// each, the gateway, DNS and the commit stream are as before, and the next
// deploy goes through as usual.
func TestTrustBoundaryAttacks(t *testing.T) {
	buildExtra(t)
	f := newAttackFixture(t)
	for _, a := range []struct {
		name string
		run  func(t *testing.T, f *attackFixture)
	}{
		{"1_forged_routing", attackForgedRouting},
		{"2_records_trusted_by_body", attackRecordsByBody},
		{"3_rollup_purges", attackRollups},
		{"4_reply_subjects", attackReplySubjects},
		{"5_push_consumers", attackPushConsumers},
		{"6_sizes_and_counts", attackSizes},
		{"7_one_bad_record", attackBadRecord},
		{"8_machine_records_and_invites", attackMachineRecords},
		{"9_host_claims", attackHostClaims},
		{"10_machine_observations", attackMachineObservations},
		{"11_agent_rpcs_and_fleet_status", attackAgentRPCs},
		{"12_mesh_pair_keys_and_rotation", attackMeshPSKs},
		{"13_invites_admit_new_machines_once", attackInvitesOnce},
		{"14_expired_credentials", attackRenewals},
		{"15_endpoints_from_admitted_addresses", attackEndpointsFromAdmittedAddresses},
		{"16_unsigned_agent_orders", attackUnsignedAgentOrders},
		{"17_gateway_reports_bound_and_capped", attackGatewayReportsBound},
		{"18_forged_canary_cookies", attackForgedCanaryCookies},
		{"19_dashboard_dns_rebinding", attackDashboardRebinding},
		{"20_plaintext_credentials", attackPlaintextCredentials},
		{"21_snapshots_and_restores", attackBackups},
		{"22_access_lines_bound", attackAccessLines},
	} {
		t.Run(a.name, func(t *testing.T) {
			a.run(t, f)
			f.unchanged(t)
			f.nextDeploy(t)
		})
	}
}

// attackFixture is a box as a thief finds it: the control plane requires
// credentials; machine m1 runs an agent; a gateway serves shop.
type attackFixture struct {
	t   *testing.T // the whole test's: what outlives one attack
	c   *cluster
	gw  *gateway
	dns string
	tls string
	// Credentials of the roles an edge box holds.
	agentCreds, meshCreds, gwCreds string
	// What the attacks must not change, as of the last deploy.
	version  int
	routes   string
	webIDs   map[string]bool
	webPorts map[int]bool
	commits  uint64
	commitID []string
}

func newAttackFixture(t *testing.T) *attackFixture {
	// Enrollment answers too (attack 13): an invite is all a box needs.
	c := newAuthCluster(t, "--enroll-listen", "127.0.0.1:0")
	// Every attack runs over TLS, as a thief's would: the credentials
	// carry the fleet CA, and the node speaks nothing else.
	if _, err := c.store.NC.TLSConnectionState(); err != nil {
		t.Fatalf("the store connection is not TLS: %v", err)
	}
	c.join("m1")
	f := &attackFixture{t: t, c: c}
	// Files of their own: the agent keeps the ones it runs with.
	issue := func(role, machine string) string {
		file := filepath.Join(c.dir, "stolen-"+role+".creds")
		args := []string{"creds", "issue", "--role", role, "--data", c.serverDir(), "-o", file}
		if machine != "" {
			args = append(args, "--machine", machine)
		}
		c.mustControl(args...)
		return file
	}
	f.agentCreds, f.meshCreds, f.gwCreds = issue(storagenode.RoleAgent, "m1"), issue(storagenode.RoleMesh, "m1"), issue(storagenode.RoleGateway, "gw1")
	f.startGateway()
	f.nextDeploy(t)
	return f
}

func (f *attackFixture) startGateway() {
	f.gw = startEdgeGateway(f.t, f.c, "gw1", f.c.url, f.gwCreds)
	f.dns, f.tls = f.gw.dns, f.gw.https
}

// startEdgeGateway starts the gateway an edge box runs, with its own
// credentials and data dir: routing, DNS, on-demand TLS from Caddy's
// internal CA for routed names, and the certificates in the store. natsURL
// is where it reaches the store (the cluster's, or a proxy's).
func startEdgeGateway(t *testing.T, c *cluster, name, natsURL, creds string) *gateway {
	t.Helper()
	return startEdgeGatewayWith(t, c, name, natsURL, creds, map[string]any{"handler": "edgeplane"})
}

// startEdgeGatewayWith is startEdgeGateway with handler on its routes.
func startEdgeGatewayWith(t *testing.T, c *cluster, name, natsURL, creds string, h map[string]any) *gateway {
	t.Helper()
	g := &gateway{http: freeAddr(t), admin: freeAddr(t), dns: freeAddr(t), https: freeAddr(t), dir: filepath.Join(c.dir, name)}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	handler := []any{map[string]any{"handle": []any{h}}}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": g.admin},
		"storage": map[string]any{"module": "edgeplane", "nats_url": natsURL, "creds_file": creds},
		"apps": map[string]any{
			"edgeplane":     map[string]any{"nats_url": natsURL, "creds_file": creds, "gateway_name": name, "snapshot_path": filepath.Join(g.dir, "routing.json")},
			"edgeplane_dns": map[string]any{"listen": []string{g.dns}, "ttl": "1s"},
			// On-demand TLS from Caddy's internal CA, for routed names only.
			"pki": map[string]any{"certificate_authorities": map[string]any{"local": map[string]any{"install_trust": false}}},
			"tls": map[string]any{"automation": map[string]any{
				"policies":  []any{map[string]any{"on_demand": true, "issuers": []any{map[string]any{"module": "internal"}}}},
				"on_demand": map[string]any{"permission": map[string]any{"module": "edgeplane"}},
			}},
			"http": map[string]any{"servers": map[string]any{
				"gw":  map[string]any{"listen": []string{g.http}, "automatic_https": map[string]any{"disable": true}, "routes": handler},
				"gws": map[string]any{"listen": []string{g.https}, "tls_connection_policies": []any{map[string]any{}}, "routes": handler},
			}},
		},
	}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(g.dir, "caddy.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + g.dir, "XDG_DATA_HOME=" + filepath.Join(g.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(g.dir, "config")}
	g.proc = start(t, "caddy "+name+" (gateway credentials)", env, extraBins.caddy, "run", "--config", path)
	eventually(t, 20*time.Second, "the gateway's projection to connect", func() bool {
		st, err := g.projection()
		return err == nil && st.Connected
	})
	return g
}

// nextDeploy applies the next revision of shop, waits for the gateway to
// serve it, and records what the next attack must leave alone.
func (f *attackFixture) nextDeploy(t *testing.T) {
	t.Helper()
	f.version++
	manifest := strings.Replace(helloV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d"`, f.version), 1)
	f.c.mustControl("deploy", "apply", "-f", f.c.manifest(fmt.Sprintf("v%d.yaml", f.version), manifest), "--drain-grace", "10ms", "--gateway-wait", "10s")
	f.webIDs, f.webPorts = map[string]bool{}, map[int]bool{}
	for _, in := range f.c.instances("shop") {
		if in.Service == "web" && in.State == store.InstanceReady {
			f.webIDs[in.ID] = true
			f.webPorts[in.Port] = true
		}
	}
	eventually(t, 10*time.Second, "the gateway to serve the new revision", func() bool {
		code, inst, err := f.gw.request("shop.example.com", "/")
		return err == nil && code == 200 && f.webIDs[inst]
	})
	f.routes = f.routesNow(t)
	f.commits, f.commitID = f.commitState(t)
}

func (f *attackFixture) routesNow(t *testing.T) string {
	t.Helper()
	return routesOf(t, f.gw)
}

// routesOf is the gateway's /edgeplane/routes.
func routesOf(t *testing.T, g *gateway) string {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/edgeplane/routes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (f *attackFixture) commitState(t *testing.T) (uint64, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	commits := storetest.Stream(t, f.c.store, f.c.store.Names.DeployCommitsStream())
	info, err := commits.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq, finalCommitIDs(t, f.c.store)
}

// unchanged checks that the gateway, DNS and the commit stream are what
// the last deploy left.
func (f *attackFixture) unchanged(t *testing.T) {
	t.Helper()
	for range 5 {
		code, inst, err := f.gw.request("shop.example.com", "/")
		if err != nil || code != 200 || !f.webIDs[inst] {
			t.Fatalf("gateway: %d %q %v, want one of %v", code, inst, err, f.webIDs)
		}
	}
	if got := f.routesNow(t); got != f.routes {
		t.Fatalf("gateway routes changed:\n got %s\nwant %s", got, f.routes)
	}
	m := new(dns.Msg)
	m.SetQuestion("web.shop.edgeplane.internal.", dns.TypeSRV)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, f.dns)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != len(f.webIDs) {
		t.Fatalf("DNS: %v %v", r, err)
	}
	for _, a := range r.Answer {
		if srv, ok := a.(*dns.SRV); !ok || !f.webPorts[int(srv.Port)] {
			t.Fatalf("DNS answer %v, want one of ports %v", a, f.webPorts)
		}
	}
	seq, ids := f.commitState(t)
	if seq != f.commits || strings.Join(ids, ",") != strings.Join(f.commitID, ",") {
		t.Fatalf("commit stream changed: %d %v, was %d %v", seq, ids, f.commits, f.commitID)
	}
}

// thief is a connection with one role's stolen credentials.
type thief struct {
	nc *nats.Conn
	st *store.Store
	// violations are the server's refusals that come without an answer
	// (a permissions violation).
	violations chan error
}

func (f *attackFixture) as(t *testing.T, creds string) *thief {
	t.Helper()
	th := &thief{violations: make(chan error, 64)}
	nc, err := store.Connect(store.ConnectOptions{URL: f.c.url, CredsFile: creds, Name: "thief " + filepath.Base(creds)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// What the server refuses without an answer shows up here.
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case th.violations <- err:
		default:
		}
	})
	th.nc = nc
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if th.st, err = store.Open(ctx, nc, f.c.store.Names); err != nil {
		t.Fatal(err)
	}
	anchor, err := store.ResolveAnchor("", creds, "")
	if err != nil {
		t.Fatal(err)
	}
	th.st.TrustAnchor(anchor)
	return th
}

// refused runs a write the role must not make and fails the test if it
// was acknowledged.
func refused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted", what)
	}
	t.Logf("%s: refused (%v)", what, err)
}

// try runs what the role must not be able to do: an error answer, or a
// permissions violation the server reports instead of an answer, is a
// refusal; an answer is a failure.
func (th *thief) try(t *testing.T, what string, fn func(ctx context.Context) error) {
	t.Helper()
	for len(th.violations) > 0 {
		<-th.violations
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		refused(t, what, err)
	case v := <-th.violations:
		cancel()
		<-done
		t.Logf("%s: refused (%v)", what, v)
	}
}

// 1. An agent publishes a routing event for another namespace's host. Its
// credentials may not publish there at all; and even the NATS account
// itself (here: control credentials) cannot make a gateway route, because
// nothing it publishes is signed by a certified signer. On-demand TLS
// issues no certificate for the forged name.
func attackForgedRouting(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	forged := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		Routes:    []store.Route{{Hosts: []string{"shop.example.com", "bank.example.com"}}},
		Endpoints: []store.Endpoint{{InstanceID: "evil", Machine: "m1", Address: "203.0.113.9", Port: 80}}}
	body, _ := json.Marshal(forged)
	head := routingHead(t, f.c)

	agent := f.as(t, f.agentCreds)
	for _, subj := range []string{n.RoutingMachineSubject("m1"), n.RoutingServiceSubject("shop", "web"), store.EdgeAPIPrefix + "." + n.RoutingServiceSubject("shop", "web")} {
		agent.try(t, "agent publishes a routing event on "+subj, func(ctx context.Context) error {
			_, err := agent.st.JS.Publish(ctx, subj, body)
			return err
		})
	}
	// Maintenance would take a namespace off the air at every gateway:
	// neither an agent's nor a gateway's credentials may publish it.
	maint, _ := json.Marshal(store.RoutingEvent{Version: 1, Kind: store.EventMaintenanceUpsert,
		Maintenance: &store.MaintenanceRecord{Namespace: "shop", On: true}})
	for _, creds := range []string{f.agentCreds, f.gwCreds} {
		x := f.as(t, creds)
		subj := n.RoutingMaintenanceSubject("shop", "")
		x.try(t, "publishing maintenance on "+subj+" with "+filepath.Base(creds), func(ctx context.Context) error {
			_, err := x.st.JS.Publish(ctx, subj, maint)
			return err
		})
	}
	if h := routingHead(t, f.c); h != head {
		t.Fatalf("the agent's routing events landed: head %d, was %d", h, head)
	}

	// The account itself: unsigned, signed by a key nobody certified, and
	// a valid event of the past copied again.
	before, _ := f.gw.projectionFull()
	stranger, _ := signing.NewSigner()
	subj := n.RoutingServiceSubject("shop", "web")
	var good *store.StoredMsg
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The live event is on the service's own subject, or in the first
	// part of its namespace's latest routing batch, whichever is later.
	if err := f.c.store.LastOf(ctx, n.RoutingEventsStream(), []string{subj, n.RoutingBatchSubject("shop", 0)}, func(m *store.StoredMsg) error {
		if good == nil || m.Seq > good.Seq {
			good = m
		}
		return nil
	}); err != nil || good == nil {
		t.Fatalf("reading the live event: %v", err)
	}
	msgs := []*nats.Msg{
		{Subject: subj, Data: body},
		{Subject: subj, Data: body, Header: nats.Header{signing.Header: {stranger.Sign(signing.Message{Subject: subj, Seq: head + 2, Body: body})}}},
		{Subject: good.Subject, Data: good.Data, Header: nats.Header{signing.Header: {good.Header.Get(signing.Header)}}},
	}
	for _, m := range msgs {
		if _, err := f.c.store.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the gateway to see the forged events", func() bool {
		st, err := f.gw.projectionFull()
		return err == nil && st.Signatures.Refused >= before.Signatures.Refused+3
	})
	st, _ := f.gw.projectionFull()
	if !strings.Contains(st.Signatures.LastRefusal, "refused routing event") || st.Signatures.TrustSource != store.TrustFromCreds {
		t.Fatalf("projection status does not say what it refused: %+v", st.Signatures)
	}
	if code, _, _ := f.gw.request("bank.example.com", "/"); code == 200 {
		t.Fatal("the forged host is routed")
	}
	// No certificate for the forged name; one for a routed name.
	if err := f.handshake("bank.example.com"); err == nil {
		t.Fatal("on-demand TLS issued a certificate for the forged host")
	}
	if err := f.handshake("shop.example.com"); err != nil {
		t.Fatalf("on-demand TLS for the routed host: %v", err)
	}
	// The stream now ends with an event nobody signed: the next deploy
	// (run by unchanged's caller) replaces it with a signed one.
}

func (f *attackFixture) handshake(host string) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", f.tls, &tls.Config{ServerName: host, InsecureSkipVerify: true})
	if err != nil {
		return err
	}
	return conn.Close()
}

// 2. Records an untrusted role writes are taken only under the key their
// body names: an agent's instance record claiming another machine's
// instance, and a heartbeat claiming another node, are skipped.
func attackRecordsByBody(t *testing.T, f *attackFixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agent := f.as(t, f.agentCreds)
	var victim store.InstanceRecord
	for _, in := range f.c.instances("shop") {
		if f.webIDs[in.ID] {
			victim = in
		}
	}
	// Under its own machine's key, a record whose body is another
	// machine's instance of shop/web, pointing elsewhere.
	claim := victim
	claim.Machine, claim.Address, claim.Port = "m2", "203.0.113.9", 80
	data, _ := json.Marshal(claim)
	agentInstances := storetest.Bucket(t, agent.st, agent.st.Names.InstancesBucket())
	if _, err := agentInstances.Put(ctx, store.InstanceKey("shop", "m1", "claim"), data); err != nil {
		t.Fatalf("the agent's write under its own key: %v", err)
	}
	agent.try(t, "agent m1 writes under machine m2's key", func(ctx context.Context) error {
		_, err := agentInstances.Put(ctx, store.InstanceKey("shop", "m2", victim.ID), data)
		return err
	})
	// The control plane republishes shop/web from stored state, as the
	// agent may ask: the claim is not among the endpoints.
	if _, err := agent.st.RequestRepublish(ctx, "m1", "shop", "web"); err != nil {
		t.Fatalf("republish request: %v", err)
	}
	insts, err := f.c.store.NamespaceInstances(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if got := insts[victim.ID]; got == nil || got.Address != victim.Address {
		t.Fatalf("the claim replaced %s: %+v", victim.ID, got)
	}

	// Its instance observations, under its own key, saying an instance
	// of machine m2 is ready: not taken. Under m2's key: refused.
	var own store.MachineObserved
	observed := storetest.Bucket(t, f.c.store, f.c.store.Names.ObservedBucket())
	if _, err := store.GetJSON(ctx, observed, "m1", &own); err != nil {
		t.Fatalf("agent m1's own observations: %v", err)
	}
	elsewhere := &store.InstanceRecord{ID: "elsewhere", Namespace: "victim", Service: "web", Machine: "m2", Address: "10.0.0.2", Port: 8080,
		State: store.InstanceStarting, Driver: "process", CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
	if _, err := f.c.store.PutInstance(ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.c.store.DeleteInstance(context.Background(), elsewhere.Key()) }()
	lie := store.MachineObserved{Version: store.RecordVersion, Machine: "m1", Instances: maps.Clone(own.Instances), UpdatedAt: time.Now().UTC()}
	if lie.Instances == nil {
		lie.Instances = map[string]store.ObservedInstance{}
	}
	lie.Instances[elsewhere.ID] = store.ObservedInstance{Namespace: "victim", State: store.InstanceReady, UpdatedAt: time.Now().Add(time.Hour).UTC()}
	data, _ = json.Marshal(&lie)
	agentObserved := storetest.Bucket(t, agent.st, agent.st.Names.ObservedBucket())
	if _, err := agentObserved.Put(ctx, "m1", data); err != nil {
		t.Fatalf("the agent's observations under its own key: %v", err)
	}
	agent.try(t, "agent m1 writes machine m2's instance observations", func(ctx context.Context) error {
		_, err := agentObserved.Put(ctx, "m2", data)
		return err
	})
	victims, err := f.c.store.NamespaceInstances(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	if got := victims[elsewhere.ID]; got == nil || got.State != store.InstanceStarting {
		t.Fatalf("m1's observation of an instance on m2 was taken: %+v", got)
	}
	// What m1's agent had written, back for the attacks that follow.
	if _, err := f.c.store.PutObserved(ctx, &own); err != nil {
		t.Fatal(err)
	}

	// meshd m1 writes its heartbeat key with a body claiming m2, long
	// dead: m2's own heartbeat is what readers see.
	mesh := f.as(t, f.meshCreds)
	genuine := store.MeshHeartbeat{Version: 1, Machine: "m2", At: time.Now().UTC(), Interval: store.Duration(5 * time.Second)}
	meshHeartbeats := storetest.Bucket(t, f.c.store, f.c.store.Names.MeshHeartbeatsBucket())
	if _, err := store.PutJSON(ctx, meshHeartbeats, store.MeshBeatKey("m2"), &genuine); err != nil {
		t.Fatal(err)
	}
	fake := store.MeshHeartbeat{Version: 1, Machine: "m2", At: time.Now().Add(-time.Hour).UTC(), Interval: store.Duration(5 * time.Second)}
	data, _ = json.Marshal(fake)
	meshMeshHeartbeats := storetest.Bucket(t, mesh.st, mesh.st.Names.MeshHeartbeatsBucket())
	if _, err := meshMeshHeartbeats.Put(ctx, store.MeshBeatKey("m1"), data); err != nil {
		t.Fatalf("meshd m1 writing its own key: %v", err)
	}
	mesh.try(t, "meshd m1 writes m2's heartbeat", func(ctx context.Context) error {
		_, err := meshMeshHeartbeats.Put(ctx, store.MeshBeatKey("m2"), data)
		return err
	})
	beats, err := f.c.store.MeshHeartbeats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hb := beats["m2"]; hb.Liveness(time.Now()) != store.LivenessAlive {
		t.Fatalf("m2 looks %s after m1's claim", hb.Liveness(time.Now()))
	}
}

// 3. A rollup would turn permission to write one key into permission to
// wipe the bucket: every bucket refuses it.
func attackRollups(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	agent := f.as(t, f.agentCreds)
	gw := f.as(t, f.gwCreds)
	before := map[string]uint64{}
	buckets := []string{n.InstancesBucket(), n.MachinesBucket(), n.LocksBucket(), n.CertsBucket()}
	for _, b := range buckets {
		before[b] = bucketMsgs(t, f.c.store, b)
	}
	for _, tc := range []struct {
		who *thief
		key string
	}{
		{agent, "$KV." + n.InstancesBucket() + "." + store.InstanceKey("shop", "m1", "x")},
		{gw, "$KV." + n.LocksBucket() + ".cp.lock.cert.x"},
		{gw, "$KV." + n.CertsBucket() + ".x"},
	} {
		m := nats.NewMsg(store.EdgeAPIPrefix + "." + tc.key)
		m.Header.Set("Nats-Rollup", "all")
		m.Data = []byte("{}")
		tc.who.try(t, "rollup on "+tc.key, func(ctx context.Context) error {
			_, err := tc.who.st.JS.PublishMsg(ctx, m)
			return err
		})
	}
	for _, b := range buckets {
		if got := bucketMsgs(t, f.c.store, b); got != before[b] {
			t.Fatalf("bucket %s holds %d messages, had %d", b, got, before[b])
		}
	}
}

func bucketMsgs(t *testing.T, s *store.Store, bucket string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	str, err := s.JS.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	return str.CachedInfo().State.Msgs
}

// 4. A request whose reply subject is the commit stream or a lock key: the
// answer goes back to the asker's account (and responders answer only
// inboxes), so nothing is written there.
func attackReplySubjects(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	agent := f.as(t, f.agentCreds)
	gw := f.as(t, f.gwCreds)
	locks := bucketMsgs(t, f.c.store, n.LocksBucket())
	req, _ := json.Marshal(store.RepublishRequest{Namespace: "shop", Service: "web"})
	for _, reply := range []string{n.DeployCommitSubject("shop", store.CommitFinal), "$KV." + n.LocksBucket() + ".cp.lock.deploy.shop"} {
		if err := agent.nc.PublishRequest(n.RoutingRepublishSubject("m1"), reply, req); err != nil {
			t.Fatal(err)
		}
		get, _ := json.Marshal(map[string]any{"seq": 1})
		if err := gw.nc.PublishRequest(store.EdgeAPIPrefix+".DIRECT.GET."+n.RoutingEventsStream(), reply, get); err != nil {
			t.Fatal(err)
		}
	}
	// The same requests again with the connections' own inboxes: once
	// they are answered, the ones before them were handled.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := agent.st.RequestRepublish(ctx, "m1", "shop", "web"); err != nil {
		t.Fatalf("a proper republish request: %v", err)
	}
	if _, err := gw.st.ReadFrom(ctx, n.RoutingEventsStream(), 1, "", func(*store.StoredMsg) error { return nil }); err != nil {
		t.Fatalf("a proper direct get: %v", err)
	}
	if got := bucketMsgs(t, f.c.store, n.LocksBucket()); got != locks {
		t.Fatalf("locks bucket holds %d messages, had %d", got, locks)
	}
	// The commit stream is checked by unchanged.
}

// 5. A push consumer delivers wherever its creator says: untrusted roles
// cannot create one, in the control account or their own.
func attackPushConsumers(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	revocations := bucketMsgs(t, f.c.store, n.RevocationsBucket())
	for _, creds := range []string{f.agentCreds, f.gwCreds, f.meshCreds} {
		th := f.as(t, creds)
		for _, api := range []string{store.EdgeAPIPrefix, "$JS.API"} {
			// Pull consumers too: none is the role's to create.
			js, err := jetstream.NewWithAPIPrefix(th.nc, api)
			if err != nil {
				t.Fatal(err)
			}
			th.try(t, "pull consumer via "+api, func(ctx context.Context) error {
				_, err := js.CreateOrUpdateConsumer(ctx, n.DeployCommitsStream(), jetstream.ConsumerConfig{Durable: "copy"})
				return err
			})
			// nats.go's jetstream package makes no push consumers: the
			// request by hand, delivering into the revocations bucket.
			raw, _ := json.Marshal(map[string]any{"stream_name": n.DeployCommitsStream(), "config": map[string]any{
				"durable_name": "copy", "deliver_subject": "$KV." + n.RevocationsBucket() + ".*", "ack_policy": "none"}})
			th.try(t, "push consumer via "+api, func(ctx context.Context) error {
				_, err := th.nc.RequestWithContext(ctx, api+".CONSUMER.CREATE."+n.DeployCommitsStream()+".copy", raw)
				return err
			})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, stream := range []string{n.DeployCommitsStream(), n.RoutingEventsStream()} {
		if _, err := f.c.store.JS.Consumer(ctx, stream, "copy"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatalf("a consumer was created on %s: %v", stream, err)
		}
	}
	if got := bucketMsgs(t, f.c.store, n.RevocationsBucket()); got != revocations {
		t.Fatalf("revocations: %d messages, had %d", got, revocations)
	}
}

// 6. Sizes: a role's messages are small, a bucket's values bounded, and
// an edge role has no JetStream of its own to fill.
func attackSizes(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	agent := f.as(t, f.agentCreds)
	gw := f.as(t, f.gwCreds)
	insts := bucketMsgs(t, f.c.store, n.InstancesBucket())
	certs := bucketMsgs(t, f.c.store, n.CertsBucket())
	agentInstances := storetest.Bucket(t, agent.st, agent.st.Names.InstancesBucket())
	agent.try(t, "agent writes a 1 MiB record", func(ctx context.Context) error {
		_, err := agentInstances.Put(ctx, store.InstanceKey("shop", "m1", "big"), make([]byte, 1<<20))
		return err
	})
	gwCerts := storetest.Bucket(t, gw.st, gw.st.Names.CertsBucket())
	gw.try(t, "gateway writes a value past the certificates bucket's limit", func(ctx context.Context) error {
		_, err := gwCerts.Put(ctx, "big", make([]byte, store.MaxCertValue+1024))
		return err
	})
	for _, api := range []string{store.EdgeAPIPrefix, "$JS.API"} {
		js, _ := jetstream.NewWithAPIPrefix(agent.nc, api)
		agent.try(t, "agent creates a stream via "+api, func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "fill", Subjects: []string{"fill.>"}})
			return err
		})
	}
	if got := bucketMsgs(t, f.c.store, n.InstancesBucket()); got != insts {
		t.Fatalf("instances: %d messages, had %d", got, insts)
	}
	if got := bucketMsgs(t, f.c.store, n.CertsBucket()); got != certs {
		t.Fatalf("certs: %d messages, had %d", got, certs)
	}
}

// 7. One undecodable record, written where an agent may write, stops no
// reader: the gateway restarts and loads, the CLI lists, and the control
// server (its storage node) restarts.
func attackBadRecord(t *testing.T, f *attackFixture) {
	agent := f.as(t, f.agentCreds)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agentInstances := storetest.Bucket(t, agent.st, agent.st.Names.InstancesBucket())
	if _, err := agentInstances.Put(ctx, store.InstanceKey("shop", "m1", "junk"), []byte("{not json")); err != nil {
		t.Fatalf("the agent's write under its own key: %v", err)
	}
	if _, err := agentInstances.Put(ctx, store.InstanceKey("shop", "m1", "future"), []byte(`{"version":99}`)); err != nil {
		t.Fatal(err)
	}
	if out := f.c.mustControl("instances", "--namespace", "shop"); !strings.Contains(out, "web") {
		t.Fatalf("instances:\n%s", out)
	}
	f.c.mustControl("deploy", "status", "shop")
	// The storage node restarts on the same port; everyone reconnects.
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(f.c.url, "nats://"))
	f.c.server.stop(syscall.SIGTERM)
	f.c.startServer("127.0.0.1:" + port)
	// The gateway restarts: a cold start from the store.
	f.gw.proc.stop(syscall.SIGTERM)
	f.startGateway()
	eventually(t, 10*time.Second, "the restarted gateway to serve shop", func() bool {
		code, inst, err := f.gw.request("shop.example.com", "/")
		return err == nil && code == 200 && f.webIDs[inst]
	})
	// The agent's republish path reads the namespace's records, junk
	// included.
	if _, err := agent.st.RequestRepublish(ctx, "m1", "shop", "web"); err != nil {
		t.Fatalf("republish with junk beside the records: %v", err)
	}
}

// 8. Machine records and invites belong to the control plane: an agent
// cannot write its own record (undoing a drain, copying labels), nor any
// invite key, and admission, which the control server runs, changes only
// the asker's address and redeems invites only for the asker.
func attackMachineRecords(t *testing.T, f *attackFixture) {
	agent := f.as(t, f.agentCreds)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.c.mustControl("machine", "drain", "m1")
	before, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil {
		t.Fatal(err)
	}
	undo := *before
	undo.State, undo.Labels = store.MachineActive, map[string]string{"tier": "payments"}
	data, _ := json.Marshal(undo)
	agentMachines := storetest.Bucket(t, agent.st, agent.st.Names.MachinesBucket())
	agent.try(t, "agent writes its own machine record", func(ctx context.Context) error {
		_, err := agentMachines.Put(ctx, "m1", data)
		return err
	})
	agentInvites := storetest.Bucket(t, agent.st, agent.st.Names.InvitesBucket())
	agent.try(t, "agent writes an invite", func(ctx context.Context) error {
		_, err := agentInvites.Put(ctx, "invite.x", []byte(`{"version":1}`))
		return err
	})
	agent.try(t, "agent reads the invites bucket", func(ctx context.Context) error {
		_, err := agentInvites.Get(ctx, "invite.x")
		return err
	})
	// An invite the operator made for another machine: redeemed through
	// admission as m2 with m1's credentials, and as m1 a second time.
	token := strings.TrimSpace(f.c.mustControl("machine", "invite"))
	agent.try(t, "agent m1 joins as m2", func(ctx context.Context) error {
		_, err := machines.RequestAdmission(ctx, agent.st, machines.AdmitJoin, machines.AdmissionRequest{Machine: "m2", Token: token, Address: "203.0.113.9"})
		return err
	})
	agent.try(t, "agent m1 joins again", func(ctx context.Context) error {
		_, err := machines.RequestAdmission(ctx, agent.st, machines.AdmitJoin, machines.AdmissionRequest{Machine: "m1", Token: token, Address: "127.0.0.1"})
		return err
	})
	// Its address it may change; nothing else moves.
	rec, err := machines.RequestAdmission(ctx, agent.st, machines.AdmitAddress, machines.AdmissionRequest{Machine: "m1", Address: before.Address})
	if err != nil {
		t.Fatalf("address admission: %v", err)
	}
	after, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != store.MachineDraining || after.State != store.MachineDraining || len(after.Labels) != len(before.Labels) {
		t.Fatalf("machine record after the agent's attempts: %+v", after)
	}
	invites := storetest.Bucket(t, f.c.store, f.c.store.Names.InvitesBucket())
	if _, err := invites.Get(ctx, "invite.x"); err == nil {
		t.Fatal("an invite key the agent wrote exists")
	}
	f.c.mustControl("machine", "enable", "m1")
}

// 9. Host and port ownership is control-plane state: no edge credential
// reads or writes a claim, so a stolen box can neither take another
// namespace's host or gateway port nor free the one shop owns.
func attackHostClaims(t *testing.T, f *attackFixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	claim, _ := json.Marshal(store.HostClaim{Version: store.RecordVersion, Host: "bank.example.com", Namespace: "shop", Since: time.Now()})
	// shop's port, claimed as an apply would (the fixture's manifest
	// exposes none; it is released after the attempts).
	shopPort, bankPort := store.PortKey{Proto: store.ProtoTCP, Port: 15432}, store.PortKey{Proto: store.ProtoTCP, Port: 5432}
	if err := f.c.store.PutPortClaim(ctx, &store.PortClaim{Proto: shopPort.Proto, Port: shopPort.Port, Namespace: "shop", Service: "web", At: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	portClaim, _ := json.Marshal(store.PortClaim{Version: store.RecordVersion, Proto: bankPort.Proto, Port: bankPort.Port, Namespace: "shop", Service: "web", At: time.Now()})
	for _, role := range []struct{ name, creds string }{{"agent", f.agentCreds}, {"mesh", f.meshCreds}, {"gateway", f.gwCreds}} {
		th := f.as(t, role.creds)
		thHosts := storetest.Bucket(t, th.st, th.st.Names.HostsBucket())
		th.try(t, role.name+" claims a host", func(ctx context.Context) error {
			_, err := thHosts.Put(ctx, store.HostKey("bank.example.com"), claim)
			return err
		})
		th.try(t, role.name+" frees shop's host", func(ctx context.Context) error {
			return thHosts.Delete(ctx, store.HostKey("shop.example.com"))
		})
		th.try(t, role.name+" reads the host claims", func(ctx context.Context) error {
			_, err := thHosts.Get(ctx, store.HostKey("shop.example.com"))
			return err
		})
		// Gateway ports are claimed in the same bucket: a stolen box can
		// neither take a port nor free one (shop's tcp/15432).
		th.try(t, role.name+" claims a port", func(ctx context.Context) error {
			_, err := thHosts.Put(ctx, store.PortClaimKey(bankPort), portClaim)
			return err
		})
		th.try(t, role.name+" frees shop's port", func(ctx context.Context) error {
			return thHosts.Delete(ctx, store.PortClaimKey(shopPort))
		})
		th.try(t, role.name+" reads the port claims", func(ctx context.Context) error {
			_, err := thHosts.Get(ctx, store.PortClaimKey(shopPort))
			return err
		})
	}
	owned, err := hosts.Owned(ctx, f.c.store, "shop")
	if err != nil || !slices.Equal(owned, []string{"shop.example.com"}) {
		t.Fatalf("shop owns %v (%v) after the attempts", owned, err)
	}
	if ports, err := f.c.store.PortClaims(ctx, []store.PortKey{bankPort, shopPort}); err != nil || len(ports) != 1 || ports[shopPort].Namespace != "shop" {
		t.Fatalf("port claims %+v (%v) after the attempts: want shop's tcp/15432 only", ports, err)
	}
	if err := f.c.store.DeletePortClaim(ctx, shopPort); err != nil {
		t.Fatal(err)
	}
}

// 10. An agent writes its own machine's heartbeat and state, and no other
// machine's: a stolen box cannot make a dead machine look alive or hide a
// live one.
func attackMachineObservations(t *testing.T, f *attackFixture) {
	agent := f.as(t, f.agentCreds)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The interval the real agent beats at, to leave m1 as fresh as it
	// found it: a beat announcing 1 s makes m1 stale 3 s on, until the
	// agent's next beat, and the next deploy would place nothing on it.
	var real store.MachineBeat
	machineBeats := storetest.Bucket(t, f.c.store, f.c.store.Names.MachineBeatsBucket())
	if _, err := store.GetJSON(ctx, machineBeats, "m1", &real); err != nil {
		t.Fatalf("m1's heartbeat: %v", err)
	}
	if err := agent.st.PutMachineBeat(ctx, "m1", time.Second); err != nil {
		t.Fatalf("an agent's own heartbeat: %v", err)
	}
	agent.try(t, "agent m1 beats for m2", func(ctx context.Context) error {
		return agent.st.PutMachineBeat(ctx, "m2", time.Second)
	})
	agent.try(t, "agent m1 writes m2's state", func(ctx context.Context) error {
		return agent.st.PutMachineState(ctx, &store.MachineState{Machine: "m2", Free: 1000})
	})
	// m2's beat filed under its own key: NATS takes it (its key), every
	// reader refuses it (the body names another machine).
	data, _ := json.Marshal(store.MachineBeat{Version: store.RecordVersion, Machine: "m2", At: time.Now()})
	agentMachineBeats := storetest.Bucket(t, agent.st, agent.st.Names.MachineBeatsBucket())
	if _, err := agentMachineBeats.Put(ctx, "m1", data); err != nil {
		t.Fatal(err)
	}
	var b store.MachineBeat
	if _, err := store.GetJSON(ctx, machineBeats, "m1", &b); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("a beat filed under another machine's key was read: %+v %v", b, err)
	}
	// (The real agent of m1 may have beaten again meanwhile: that one is
	// its own.)
	if _, beats, err := f.c.store.MachineObservations(ctx); err != nil || beats["m2"].Machine != "" || (beats["m1"].Machine != "" && beats["m1"].Machine != "m1") {
		t.Fatalf("observations after the forged beat: %+v %v", beats, err)
	}
	for _, key := range []string{"m2"} {
		if _, err := machineBeats.Get(ctx, key); err == nil {
			t.Fatalf("a heartbeat for %s exists", key)
		}
	}
	// Its own key back to the truth.
	if err := agent.st.PutMachineBeat(ctx, "m1", time.Duration(real.Interval)); err != nil {
		t.Fatal(err)
	}
}

// 11. The agent RPCs that read a machine (its inventory, its instances'
// output, its images) are the control plane's to call: no edge credential
// asks them, not even of its own machine; and the fleet summaries, and the
// lease of the one writing them, are the control server's.
func attackAgentRPCs(t *testing.T, f *attackFixture) {
	for _, role := range []struct{ name, creds string }{{"agent", f.agentCreds}, {"mesh", f.meshCreds}, {"gateway", f.gwCreds}} {
		th := f.as(t, role.creds)
		thLocks := storetest.Bucket(t, th.st, th.st.Names.LocksBucket())
		thFleetStatus := storetest.Bucket(t, th.st, th.st.Names.FleetStatusBucket())
		for _, call := range []struct {
			cmd string
			req any
		}{
			{store.CmdInventory, struct{}{}},
			{store.CmdLogs, store.LogsRequest{InstanceID: "x", Namespace: "shop", Offset: -1}},
			{store.CmdResolveImage, store.ResolveImageRequest{Image: "hello"}},
			// A stolen credential must not move a box to another release,
			// even a signed one.
			{store.CmdUpgrade, store.UpgradeRequest{Release: "1.2.0", Attempt: int(time.Now().UnixMilli()), AllowDowngrade: true}},
		} {
			th.try(t, role.name+" calls m1's "+call.cmd, func(ctx context.Context) error {
				// Sent as it is, unsigned: what the role's permissions
				// refuse, before any agent could.
				return store.Call(ctx, th.nc, th.st.Names.RPCSubject("m1", call.cmd), "m1", call.cmd, call.req, nil)
			})
		}
		th.try(t, role.name+" writes a fleet summary", func(ctx context.Context) error {
			_, err := store.PutJSON(ctx, thFleetStatus, "shop", &store.NamespaceStatus{Version: store.RecordVersion, Namespace: "shop"})
			return err
		})
		// Holding the writer's lease would silence the fleet status.
		th.try(t, role.name+" takes the fleet status lease", func(ctx context.Context) error {
			l, err := store.AcquireLease(ctx, th.st.JS, thLocks, store.FleetStatusLockKey, store.LeaseOptions{TTL: time.Minute, Holder: "thief"})
			if err == nil {
				_ = l.Release(ctx)
			}
			return err
		})
	}
}

// 12. Every pair of meshd nodes shares a preshared key that only those two
// are told: m1's mesh credentials (and m1's node secret, stolen with the
// box) get m1's pairs' keys, never another pair's, nor the secret they are
// derived from. Nor do they rotate another node's key (a thief who could
// would put their own key in its place), or get relay credentials in
// another node's name. The box's agent and gateway credentials get none of
// the mesh's secrets or registrar answers.
func attackMeshPSKs(t *testing.T, f *attackFixture) {
	ctx := context.Background()
	s := f.c.store
	secrets := map[string]string{}
	for _, m := range []string{"m1", "m2", "m3"} {
		tok, _, err := invites.Create(ctx, s, invites.Spec{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var pub [32]byte
		_, _ = rand.Read(pub[:])
		var rep store.MeshRegisterReply
		if err := store.Call(ctx, s.NC, s.Names.RegistrarSubject("register."+m), "registrar", "register", store.MeshRegisterRequest{
			Version: store.RecordVersion, Token: tok, Machine: m, PublicKey: base64.StdEncoding.EncodeToString(pub[:]),
			Capabilities: map[string]string{store.MeshCapPSK: "v1"}}, &rep); err != nil {
			t.Fatal(err)
		}
		secrets[m] = rep.Secret
	}
	t.Cleanup(func() {
		for m, secret := range secrets {
			_ = store.Call(ctx, s.NC, s.Names.RegistrarSubject("leave."+m), "registrar", "leave", store.MeshLeaveRequest{Machine: m, Secret: secret}, nil)
		}
	})
	th := f.as(t, f.meshCreds) // m1's
	var own store.MeshPSKReply
	if err := store.Call(ctx, th.nc, s.Names.RegistrarSubject("psk.m1"), "registrar", "psk",
		store.MeshPSKRequest{Version: store.RecordVersion, Machine: "m1", Secret: secrets["m1"], Peers: []string{"m2", "m3"}}, &own); err != nil {
		t.Fatalf("m1 asking for its own pairs' keys: %v", err)
	}
	secret, err := s.MeshPSKSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := registrar.PSK(secret, "m2", "m3")
	for peer, k := range own.PSKs {
		want := registrar.PSK(secret, "m1", peer)
		if k != base64.StdEncoding.EncodeToString(want[:]) || k == base64.StdEncoding.EncodeToString(other[:]) {
			t.Fatalf("m1 was told %s for its pair with %s", k, peer)
		}
	}
	if len(own.PSKs) != 2 {
		t.Fatalf("m1's keys: %v", own.PSKs)
	}
	ask := func(subject string, req store.MeshPSKRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var rep store.MeshPSKReply
			err := store.Call(ctx, th.nc, s.Names.RegistrarSubject(subject), "registrar", "psk", req, &rep)
			if err == nil && len(rep.PSKs) > 0 {
				return nil
			}
			return cmp.Or(err, errors.New("no key"))
		}
	}
	m2 := store.MeshPSKRequest{Version: store.RecordVersion, Machine: "m2", Secret: secrets["m2"], Peers: []string{"m3"}}
	th.try(t, "m1's mesh credentials ask for m2-m3's key on m2's subject", ask("psk.m2", m2))
	th.try(t, "m1's mesh credentials ask for m2-m3's key on m1's subject", ask("psk.m1", m2))
	th.try(t, "m1's mesh credentials ask on the unbound subject", ask("psk", m2))
	thMeshKeys := storetest.Bucket(t, th.st, th.st.Names.MeshKeysBucket())
	th.try(t, "m1's mesh credentials read the secret the keys derive from", func(ctx context.Context) error {
		_, err := thMeshKeys.Get(ctx, store.MeshPSKSecretKey)
		return err
	})
	th.try(t, "m1's mesh credentials overwrite the secret the keys derive from", func(ctx context.Context) error {
		_, err := thMeshKeys.Put(ctx, store.MeshPSKSecretKey, make([]byte, 32))
		return err
	})
	if again, err := s.MeshPSKSecret(ctx); err != nil || string(again) != string(secret) {
		t.Fatalf("the secret changed: %v", err)
	}

	m2Key := func() string {
		rec, err := s.MeshPeer(ctx, "m2")
		if err != nil {
			t.Fatal(err)
		}
		return rec.PublicKey
	}
	before := m2Key()
	var thiefKey [32]byte
	_, _ = rand.Read(thiefKey[:])
	rotate := func(subject string, req store.MeshRotateRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			req.Version, req.PublicKey = store.RecordVersion, base64.StdEncoding.EncodeToString(thiefKey[:])
			return store.Call(ctx, th.nc, s.Names.RegistrarSubject(subject), "registrar", "rotate", req, nil)
		}
	}
	th.try(t, "m1's mesh credentials rotate m2's key on m2's subject", rotate("rotate.m2", store.MeshRotateRequest{Machine: "m2", Secret: secrets["m2"]}))
	th.try(t, "m1's mesh credentials rotate m2's key on m1's subject", rotate("rotate.m1", store.MeshRotateRequest{Machine: "m2", Secret: secrets["m2"]}))
	th.try(t, "m1's mesh credentials rotate on the unbound subject", rotate("rotate", store.MeshRotateRequest{Machine: "m2", Secret: secrets["m2"]}))
	thMeshPeers := storetest.Bucket(t, th.st, th.st.Names.MeshPeersBucket())
	th.try(t, "m1's mesh credentials ask for m2's rotation in its peer record", func(ctx context.Context) error {
		_, err := thMeshPeers.Put(ctx, store.MeshPeerKey("m2"), []byte(`{"rotate_requested":"2099-01-01T00:00:00Z"}`))
		return err
	})
	if after := m2Key(); after != before {
		t.Fatalf("m2's key changed from %s to %s", before, after)
	}
	th.try(t, "m1's mesh credentials get relay credentials in m2's name", func(ctx context.Context) error {
		var rep store.MeshRelayReply
		return store.Call(ctx, th.nc, s.Names.RegistrarSubject("relay.m2"), "registrar", "relay",
			store.MeshRelayRequest{Version: store.RecordVersion, Machine: "m2", Secret: secrets["m2"]}, &rep)
	})
	th.try(t, "m1's mesh credentials ask for m2's relay credentials on m1's subject", func(ctx context.Context) error {
		var rep store.MeshRelayReply
		return store.Call(ctx, th.nc, s.Names.RegistrarSubject("relay.m1"), "registrar", "relay",
			store.MeshRelayRequest{Version: store.RecordVersion, Machine: "m2", Secret: secrets["m2"]}, &rep)
	})
	th.try(t, "m1's mesh credentials read the secret relays check credentials against", func(ctx context.Context) error {
		if _, err := s.MeshRelaySecret(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := thMeshKeys.Get(ctx, store.MeshRelaySecretKey)
		return err
	})
	// The same credentials rotate their own machine's key.
	if err := rotate("rotate.m1", store.MeshRotateRequest{Machine: "m1", Secret: secrets["m1"]})(ctx); err != nil {
		t.Fatalf("m1 rotating its own key: %v", err)
	}
	// The other edge roles of m1's box (agent, gateway) get none of it,
	// even with m1's node secret.
	for _, role := range []struct{ name, creds string }{{"agent", f.agentCreds}, {"gateway", f.gwCreds}} {
		other := f.as(t, role.creds)
		otherMeshKeys := storetest.Bucket(t, other.st, other.st.Names.MeshKeysBucket())
		for _, key := range []string{store.MeshPSKSecretKey, store.MeshRelaySecretKey} {
			other.try(t, role.name+" credentials read the mesh secret "+key, func(ctx context.Context) error {
				_, err := otherMeshKeys.Get(ctx, key)
				return err
			})
		}
		for _, verb := range []string{"psk", "rotate", "relay"} {
			other.try(t, role.name+" credentials ask the registrar "+verb+".m1", func(ctx context.Context) error {
				req := map[string]any{"version": store.RecordVersion, "machine": "m1", "secret": secrets["m1"],
					"peers": []string{"m2"}, "public_key": base64.StdEncoding.EncodeToString(thiefKey[:])}
				return store.Call(ctx, other.nc, s.Names.RegistrarSubject(verb+".m1"), "registrar", verb, req, nil)
			})
		}
	}
}

// projectionFull is the gateway's whole projection status.
func (g *gateway) projectionFull() (*projection.Status, error) {
	resp, err := http.Get("http://" + g.admin + "/edgeplane/projection")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st projection.Status
	return &st, json.NewDecoder(resp.Body).Decode(&st)
}
