package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// routingEventsAfter reads every routing event after seq.
func routingEventsAfter(t *testing.T, s *store.Store, seq uint64) []store.RoutingEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sRouting := storetest.Stream(t, s, s.Names.RoutingEventsStream())
	info, err := sRouting.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.RoutingEvent
	for q := seq + 1; q <= info.State.LastSeq; q++ {
		m, err := sRouting.GetMsg(ctx, q)
		if err != nil {
			t.Fatalf("routing event %d: %v", q, err)
		}
		var ev store.RoutingEvent
		if err := store.Decode("routing event", m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// The orchestrator is killed with SIGKILL right after each of the nine apply
// steps: a failpoint holds it there (lease renewal and its connection still
// alive) until the test kills it from outside. Whatever the step: routing
// never shows an uncommitted deploy, status says what happened, the namespace
// lease frees within its TTL, and the next apply succeeds (completing a
// committed one).
func TestCrashAtEveryApplyStep(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	ctx := context.Background()
	const ttl = 2 * time.Second
	applyArgs := func(version string) []string {
		return []string{"deploy", "apply", "-f", writeManifest(t, c.dir, version),
			"--lease-ttl", ttl.String(), "--drain-grace", "10ms", "--gateway-wait", "1s", "--stop-grace", "2s"}
	}
	apply := func(version string) (string, string, int) {
		return c.control(applyArgs(version)...)
	}
	if out, e, code := apply("0"); code != 0 {
		t.Fatalf("baseline apply: %d\n%s\n%s", code, out, e)
	}
	idRe := regexp.MustCompile(`deploy (\S+) of shop`)
	points := []string{"after_preview", "after_lease", "after_probe", "after_status", "after_candidates",
		"after_checkpoint", "after_final_commit", "after_publish", "after_drain"}
	var report []string
	locks := storetest.Bucket(t, c.store, c.store.Names.LocksBucket())
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	for i, fp := range points {
		step := i + 1
		head := routingHead(t, c)
		p := start(t, "control deploy apply ("+fp+")",
			append(c.natsEnv(storagenode.RoleControl, ""), "EDGEPLANE_FAILPOINTS="+fp, "EDGEPLANE_FAILPOINT_ACTION=pause"),
			bins.control, applyArgs(fmt.Sprintf("%d", step))...)
		p.waitOutput(t, regexp.QuoteMeta(failpoint.PausedMarker+fp), 30*time.Second)
		p.stop(syscall.SIGKILL)
		crashed := time.Now()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("step %d (%s): want death by SIGKILL, got %v\n%s", step, fp, p.cmd.ProcessState, p.output())
		}
		out := p.output()
		m := idRe.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("step %d: no deploy id in\n%s", step, out)
		}
		id := m[1]
		live, err := c.store.LiveCommit(ctx, "shop")
		if err != nil {
			t.Fatal(err)
		}
		committed := live.ID == id
		if committed != (step >= 7) {
			t.Fatalf("step %d: live commit %s, crashed deploy %s", step, live.ID, id)
		}
		// No partial routing: an event of this deploy exists only if its
		// final commit does; before the commit nothing was published.
		events := routingEventsAfter(t, c.store, head)
		for _, ev := range events {
			if ev.DeployID == id && !committed {
				t.Fatalf("step %d: routing event %s of uncommitted deploy %s", step, ev.Identity(), id)
			}
		}
		if step <= 7 && len(events) != 0 {
			t.Fatalf("step %d: %d routing events went out before the crash point", step, len(events))
		}
		if step >= 8 && len(events) == 0 {
			t.Fatalf("step %d: the committed deploy's routing events are missing", step)
		}
		// Status says what happened.
		var st store.DeployStatus
		_, serr := store.GetJSON(ctx, statuses, "shop."+id, &st)
		switch {
		case step <= 3:
			if serr == nil {
				t.Fatalf("step %d: status written before step 4: %+v", step, st)
			}
		case serr != nil:
			t.Fatalf("step %d: no status for %s: %v", step, id, serr)
		case step <= 7 && st.State != store.DeployApplying:
			t.Fatalf("step %d: status %s", step, st.State)
		case step >= 8 && (st.State != store.DeployCommitted || !st.RoutingPublished):
			t.Fatalf("step %d: status %+v", step, st)
		}
		// The crashed orchestrator's lease frees within its TTL (the
		// server expires keys with one-second granularity); the control
		// server may take it next to finish the deploy.
		var freed time.Duration
		if step >= 2 {
			eventually(t, ttl+3*time.Second, "the lease to expire", func() bool {
				var h store.LeaseHolder
				_, err := store.GetJSON(ctx, locks, store.DeployLockKey("shop"), &h)
				return store.HasCode(err, store.CodeNotFound) || (err == nil && h.Purpose != "deploy "+id)
			})
			freed = time.Since(crashed)
			if freed > ttl+1500*time.Millisecond {
				t.Fatalf("step %d: lease freed after %s, TTL %s", step, freed, ttl)
			}
		}
		// The next apply succeeds and settles the crashed one.
		if out, e, code := apply(fmt.Sprintf("%db", step)); code != 0 {
			t.Fatalf("step %d: the next apply failed: %d\n%s\n%s", step, code, out, e)
		}
		var after store.DeployStatus
		if step >= 4 {
			if _, err := store.GetJSON(ctx, statuses, "shop."+id, &after); err != nil {
				t.Fatal(err)
			}
			want := store.DeployFailed
			if step >= 7 {
				want = store.DeployCommitted
			}
			if after.State != want || (step >= 7 && !after.RoutingPublished) {
				t.Fatalf("step %d: after the next apply the crashed deploy is %+v", step, after)
			}
		}
		report = append(report, fmt.Sprintf("%-18s committed=%-5v routing_events=%d lease_freed=%-6s status_after=%s",
			fp, committed, len(events), freed.Round(100*time.Millisecond), dash(string(after.State))))
	}
	t.Logf("crash at each step:\n%s", strings.Join(report, "\n"))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// With every control-plane node down, the gateway and DNS keep answering
// from their last good state, and still do after a restart (from their
// snapshots).
func TestControlPlaneDownDataPlaneServes(t *testing.T) {
	buildExtra(t)
	c := newCluster(t)
	c.join("m1")
	if out, e, code := c.control("deploy", "apply", "-f", writeManifest(t, c.dir, "1"), "--drain-grace", "10ms", "--gateway-wait", "1s"); code != 0 {
		t.Fatalf("apply: %d\n%s\n%s", code, out, e)
	}
	gwAddr, dnsAddr := freeAddr(t), freeAddr(t)
	gwSnap, dnsSnap := filepath.Join(c.dir, "gw-routing.json"), filepath.Join(c.dir, "dns-routing.json")
	cfg := map[string]any{
		"admin": map[string]any{"disabled": true},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": c.url, "snapshot_path": gwSnap, "gateway_name": "gw1"},
			"http": map[string]any{"servers": map[string]any{"gw": map[string]any{
				"listen":          []string{gwAddr},
				"automatic_https": map[string]any{"disable": true},
				"routes":          []any{map[string]any{"handle": []any{map[string]any{"handler": "edgeplane"}}}},
			}}},
		},
	}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(c.dir, "caddy.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	caddyEnv := []string{"HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home}
	startGW := func(name string) *proc {
		return start(t, name, caddyEnv, extraBins.caddy, "run", "--config", cfgPath)
	}
	startDNS := func(name string) *proc {
		p := start(t, name, nil, extraBins.dns, "--nats", c.url, "--listen", dnsAddr, "--snapshot", dnsSnap)
		p.waitOutput(t, `serving dns`, 20*time.Second)
		return p
	}
	gw := startGW("caddy")
	dnsP := startDNS("edgeplane-dns")

	client := &http.Client{Timeout: 2 * time.Second}
	httpOK := func() error {
		req, _ := http.NewRequest("GET", "http://"+gwAddr+"/?format=json", nil)
		req.Host = "shop.example.com"
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"instance"`) {
			return fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		return nil
	}
	dnsOK := func() error {
		m := new(dns.Msg)
		m.SetQuestion("web.shop.edgeplane.internal.", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, dnsAddr)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		return nil
	}
	eventually(t, 30*time.Second, "the gateway to route shop.example.com", func() bool { return httpOK() == nil })
	eventually(t, 30*time.Second, "DNS to answer web.shop", func() bool { return dnsOK() == nil })
	eventually(t, 30*time.Second, "both snapshots on disk", func() bool {
		_, e1 := os.Stat(gwSnap)
		_, e2 := os.Stat(dnsSnap)
		return e1 == nil && e2 == nil
	})

	// Every control-plane node down: the one server and its embedded NATS.
	c.server.stop(syscall.SIGKILL)
	served, failed := 0, 0
	probe := func(d time.Duration) {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			for _, f := range []func() error{httpOK, dnsOK} {
				if err := f(); err != nil {
					failed++
					t.Errorf("with the control plane down: %v", err)
				} else {
					served++
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	probe(4 * time.Second)
	// Restarted while NATS is still down: they serve their snapshots.
	gw.stop(syscall.SIGTERM)
	dnsP.stop(syscall.SIGTERM)
	startGW("caddy (restarted, NATS down)")
	startDNS("edgeplane-dns (restarted, NATS down)")
	eventually(t, 20*time.Second, "the restarted gateway to serve its snapshot", func() bool { return httpOK() == nil })
	probe(3 * time.Second)
	if failed > 0 {
		t.Fatalf("%d requests failed with the control plane down", failed)
	}
	t.Logf("control plane down: %d requests served (HTTP via the gateway and DNS), %d failed, across a gateway and DNS restart", served, failed)
}

// The data plane with credentials required: the custom Caddy (gateway,
// certificate storage, renewal worker) and the standalone DNS server run
// with gateway-role credentials. A deploy is routed through both, the
// gateway's observation reaches cp_gateways (so apply sees it), the
// gateway's certificate work lands in the store, no process hits a
// permissions violation, and with the control plane killed both keep
// answering.
func TestGatewayRoleCredentialsServeAndSurviveControlPlaneLoss(t *testing.T) {
	buildExtra(t)
	c := newAuthCluster(t)
	c.join("m1")
	gwCreds := c.issueCreds(storagenode.RoleGateway, "gw1")

	gwAddr, adminAddr, dnsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	dir := filepath.Join(c.dir, "gw1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": adminAddr},
		"storage": map[string]any{"module": "edgeplane", "nats_url": c.url, "creds_file": gwCreds},
		"apps": map[string]any{
			"edgeplane": map[string]any{"nats_url": c.url, "creds_file": gwCreds, "gateway_name": "gw1",
				"snapshot_path": filepath.Join(dir, "routing.json")},
			// The renewal worker: a durable consumer shared by the fleet.
			"edgeplane_certs": map[string]any{"gateway_name": "gw1"},
			// A certificate from Caddy's internal CA: its CA and the
			// certificate go through the edgeplane storage, under its locks.
			"pki": map[string]any{"certificate_authorities": map[string]any{"local": map[string]any{"install_trust": false}}},
			"tls": map[string]any{
				"certificates": map[string]any{"automate": []string{"shop.example.com"}},
				"automation": map[string]any{"policies": []any{map[string]any{
					"subjects": []string{"shop.example.com"}, "issuers": []any{map[string]any{"module": "internal"}},
				}}},
			},
			"http": map[string]any{"servers": map[string]any{"gw": map[string]any{
				"listen":          []string{gwAddr},
				"automatic_https": map[string]any{"disable": true},
				"routes":          []any{map[string]any{"handle": []any{map[string]any{"handler": "edgeplane"}}}},
			}}},
		},
	}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	caddyEnv := []string{"HOME=" + dir, "XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}
	gw := &gateway{http: gwAddr, admin: adminAddr, dir: dir}
	gw.proc = start(t, "caddy (gateway credentials)", caddyEnv, extraBins.caddy, "run", "--config", cfgPath)
	eventually(t, 20*time.Second, "the gateway's projection to connect", func() bool {
		st, err := gw.projection()
		return err == nil && st.Connected
	})
	dnsP := start(t, "edgeplane-dns (gateway credentials)", nil, extraBins.dns, "--nats", c.url, "--creds", gwCreds,
		"--listen", dnsAddr, "--snapshot", filepath.Join(dir, "dns-routing.json"))
	dnsP.waitOutput(t, `serving dns`, 20*time.Second)

	// The apply waits for the gateway's observation: it reached cp_gateways.
	out := c.mustControl("deploy", "apply", "-f", writeManifest(t, c.dir, "1"), "--drain-grace", "10ms", "--gateway-wait", "10s")
	if !strings.Contains(out, "1/1 gateways serving revision 1") {
		t.Fatalf("apply did not see the gateway's observation:\n%s", out)
	}
	insts := c.instances("shop")
	if len(insts) != 1 {
		t.Fatalf("instances: %+v", insts)
	}
	httpOK := func() error {
		code, inst, err := gw.request("shop.example.com", "/")
		if err != nil {
			return err
		}
		if code != 200 || inst != insts[0].ID {
			return fmt.Errorf("status %d, instance %q (want %s)", code, inst, insts[0].ID)
		}
		return nil
	}
	dnsOK := func() error {
		m := new(dns.Msg)
		m.SetQuestion("web.shop.edgeplane.internal.", dns.TypeSRV)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, dnsAddr)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			return fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		if srv, ok := r.Answer[0].(*dns.SRV); !ok || int(srv.Port) != insts[0].Port {
			return fmt.Errorf("answer %v, want port %d", r.Answer[0], insts[0].Port)
		}
		return nil
	}
	eventually(t, 10*time.Second, "the gateway to route shop.example.com", func() bool { return httpOK() == nil })
	eventually(t, 10*time.Second, "DNS to answer web.shop", func() bool { return dnsOK() == nil })

	// The gateway's certificate work is in the store, read back with
	// control credentials.
	ctl, err := certs.New(store.Bound(c.store), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var certKeys []string
	eventually(t, 20*time.Second, "the gateway's certificate for shop.example.com in the store", func() bool {
		keys, err := ctl.List(context.Background(), "certificates", true)
		certKeys = certKeys[:0]
		for _, k := range keys {
			if strings.HasSuffix(k, "shop.example.com.crt") || strings.HasSuffix(k, "shop.example.com.key") {
				certKeys = append(certKeys, k)
			}
		}
		return err == nil && len(certKeys) == 2
	})
	if _, err := c.store.JS.Consumer(context.Background(), c.store.Names.CertRenewalsStream(), "cert_renewals"); err != nil {
		t.Fatalf("the gateway's renewal worker created no consumer: %v", err)
	}
	// The rest of the certificate work an ACME gateway does (the order
	// budget, status records, renewal schedules) with the same credentials.
	checkGatewayCertWork(t, c, gwCreds)

	// No permissions violation anywhere: the roles are sufficient.
	for _, p := range []*proc{gw.proc, dnsP, c.agents["m1"]} {
		if strings.Contains(strings.ToLower(p.output()), "permissions violation") {
			t.Fatalf("%s hit a permissions violation:\n%s", p.name, p.output())
		}
	}

	// The control plane (the server and its embedded NATS) is killed.
	c.server.stop(syscall.SIGKILL)
	eventually(t, 10*time.Second, "the gateway to notice NATS is gone", func() bool {
		st, err := gw.projection()
		return err == nil && !st.Connected
	})
	served, failed := 0, 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range []func() error{httpOK, dnsOK} {
			if err := f(); err != nil {
				failed++
				t.Errorf("with the control plane down: %v", err)
			} else {
				served++
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed with the control plane down", failed, served+failed)
	}
	t.Logf("gateway-role credentials: apply saw 1/1 gateways; certificate %v stored; control plane killed: %d requests served "+
		"(HTTP through the gateway and DNS SRV), %d failed", certKeys, served, failed)
}

// checkGatewayCertWork runs the certificate work of an ACME gateway with
// gateway-role credentials against the real store: the fleet's order
// budget, a status record and a renewal schedule (Renewer.Record), and the
// shared renewal consumer taking the scheduled item.
func checkGatewayCertWork(t *testing.T, c *cluster, gwCreds string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, err := store.Connect(store.ConnectOptions{URL: c.url, CredsFile: gwCreds, Name: "gateway creds probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	gs, err := store.Open(ctx, nc, c.store.Names)
	if err != nil {
		t.Fatal(err)
	}
	budget, err := certs.NewBudget(store.Bound(gs), certs.BudgetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := budget.Charge(ctx, "api.probe.example.com"); err != nil || u.Used != 1 {
		t.Fatalf("charging the order budget with gateway credentials: %+v %v", u, err)
	}
	taken := make(chan string, 1)
	// The fleet's one renewal consumer, which the control plane provisions
	// (a gateway may create none): the item goes to whichever gateway
	// pulls it first, this probe or the running gateway, whose attempt
	// shows in the host's status.
	r, err := certs.NewRenewer(certs.RenewerConfig{Link: store.Bound(gs), Name: "probe", MinInterval: time.Second,
		NextRenewal: func(certs.RenewResult) time.Time { return time.Now().Add(time.Second) },
		Renew: func(_ context.Context, item certs.RenewalItem) (certs.RenewResult, error) {
			select {
			case taken <- item.Host:
			default:
			}
			return certs.RenewResult{Expiry: time.Now().Add(90 * 24 * time.Hour)}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	recordedAt := time.Now()
	if err := r.Record(ctx, certs.RenewalItem{Host: "api.probe.example.com"}, certs.RenewResult{Expiry: time.Now().Add(90 * 24 * time.Hour)}, nil); err != nil {
		t.Fatalf("recording a certificate with gateway credentials: %v", err)
	}
	st, err := certs.ListStatus(ctx, c.store)
	if err != nil {
		t.Fatal(err)
	}
	recorded := false
	for _, s := range st {
		recorded = recorded || s.Host == "api.probe.example.com" && s.Gateway == "probe"
	}
	if !recorded {
		t.Fatalf("no status record of api.probe.example.com: %+v", st)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for worked := false; !worked; {
		select {
		case host := <-taken:
			if host != "api.probe.example.com" {
				t.Fatalf("renewal worker took %q", host)
			}
			worked = true
		case err := <-done:
			t.Fatalf("renewal worker with gateway credentials: %v", err)
		case <-ctx.Done():
			t.Fatal("the scheduled renewal never reached a gateway's worker")
		case <-tick.C:
			sts, _ := certs.ListStatus(ctx, c.store)
			for _, s := range sts {
				worked = worked || s.Host == "api.probe.example.com" && s.Gateway != "probe" && s.LastAttempt.After(recordedAt)
			}
		}
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatalf("renewal worker: %v", err)
	}
}
