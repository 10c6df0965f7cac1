package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Day two: the control plane finishes what an orchestrator left, owns
// hostnames, retires machines and namespaces, fails fast on a dead machine,
// and says where the layers disagree.

var gwV2 = strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "2"`, 1)

// gwSlow is gwV1 at another version whose candidates take 20 s to become
// ready (of a 30 s readiness timeout): long enough to interrupt them.
var gwSlow = strings.Replace(strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "slow", HELLO_READY_DELAY: "20s"`, 1),
	"timeout: 10s", "timeout: 30s", 1)

// applyArgs are the apply flags the tests in this file use: a short lease
// TTL, so an abandoned deploy is noticed quickly.
func applyArgs(file string, extra ...string) []string {
	return append([]string{"deploy", "apply", "-f", file, "--lease-ttl", "2s", "--drain-grace", "500ms", "--stop-grace", "2s"}, extra...)
}

// startApply runs `control deploy apply` in the background.
func (c *cluster) startApply(name string, env []string, args ...string) *proc {
	return start(c.t, name, append(c.natsEnv(storagenode.RoleControl, ""), env...), bins.control, args...)
}

// liveIDs is the instance IDs the live commit of ns routes.
func liveIDs(t *testing.T, c *cluster, ns string) (commit string, ids []string) {
	t.Helper()
	live, err := c.store.LiveCommit(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, sl := range live.Slots {
		ids = append(ids, sl.InstanceID)
	}
	return live.ID, ids
}

// servesOnly reports whether n requests through gw for host all reach one
// of ids.
func servesOnly(gw *gateway, host string, ids []string, n int) bool {
	for range n {
		code, inst, err := gw.request(host, "/")
		if err != nil || code != 200 || !slices.Contains(ids, inst) {
			return false
		}
	}
	return true
}

// gone reports whether none of insts has a record or answers.
func gone(t *testing.T, c *cluster, insts []store.InstanceRecord) bool {
	t.Helper()
	recs := map[string]bool{}
	for _, r := range c.instances(insts[0].Namespace) {
		recs[r.ID] = true
	}
	for _, in := range insts {
		if recs[in.ID] {
			return false
		}
		if _, err := get(t, addrOf(in)); err == nil {
			return false
		}
	}
	return true
}

func deployStatus(t *testing.T, c *cluster, ns, id string) store.DeployStatus {
	t.Helper()
	var st store.DeployStatus
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	if _, err := store.GetJSON(context.Background(), statuses, ns+"."+id, &st); err != nil {
		t.Fatalf("status of %s: %v", id, err)
	}
	return st
}

var deployIDRe = regexp.MustCompile(`deploy (\S+) of shop`)

// An orchestrator killed with SIGKILL, after its final commit or before
// it, with nothing else run: the control server finishes the deploy (or
// records it failed and stops its candidates) within the lease TTL and a
// few seconds, while the gateway serves without a failed request. Ctrl-C
// on either side of the commit ends cleanly and says which.
func TestAbandonedAndInterruptedDeploysAreFinished(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	gw2 := c.startGateway("gw2")
	const ttl = 2 * time.Second
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 4, stop)
	var report []string

	// 1. Killed after its final commit.
	v1 := c.instances("shop")
	p := c.startApply("apply v2 (killed after the final commit)",
		[]string{"EDGEPLANE_FAILPOINTS=after_final_commit", "EDGEPLANE_FAILPOINT_ACTION=pause"}, applyArgs(c.manifest("v2.yaml", gwV2))...)
	p.waitOutput(t, regexp.QuoteMeta(failpoint.PausedMarker+"after_final_commit"), 30*time.Second)
	p.stop(syscall.SIGKILL)
	killed := time.Now()
	id2, v2IDs := liveIDs(t, c, "shop")
	eventually(t, ttl+5*time.Second, "every gateway to serve revision 2", func() bool {
		return servesOnly(gw, "shop.example.com", v2IDs, 8) && servesOnly(gw2, "shop.example.com", v2IDs, 8)
	})
	served := time.Since(killed)
	eventually(t, 20*time.Second, "revision 1's instances to be stopped", func() bool { return gone(t, c, v1) })
	drained := time.Since(killed)
	st := deployStatus(t, c, "shop", id2)
	if st.State != store.DeployCommitted || !st.RoutingPublished || !st.Settled || len(st.Cleanup) != 0 {
		t.Fatalf("status of the finished deploy: %+v", st)
	}
	c.server.waitOutput(t, "finished deploy "+id2+" of shop", 5*time.Second)
	report = append(report, fmt.Sprintf("killed after the final commit: both gateways serve revision 2 after %s (lease TTL %s), revision 1 stopped after %s",
		served.Round(100*time.Millisecond), ttl, drained.Round(100*time.Millisecond)))

	// 2. Killed before its final commit, candidates ready.
	p = c.startApply("apply v3 (killed before the final commit)",
		[]string{"EDGEPLANE_FAILPOINTS=after_candidates", "EDGEPLANE_FAILPOINT_ACTION=pause"}, applyArgs(c.manifest("v3.yaml", gwV1))...)
	p.waitOutput(t, regexp.QuoteMeta(failpoint.PausedMarker+"after_candidates"), 30*time.Second)
	id3 := deployIDRe.FindStringSubmatch(p.output())[1]
	var cands []store.InstanceRecord
	for _, in := range c.instances("shop") {
		if in.DeployID == id3 {
			cands = append(cands, in)
		}
	}
	if len(cands) != 2 {
		t.Fatalf("want 2 candidates of %s, got %+v", id3, cands)
	}
	p.stop(syscall.SIGKILL)
	killed = time.Now()
	eventually(t, ttl+5*time.Second, "the abandoned deploy to be recorded failed with its candidates stopped", func() bool {
		st := deployStatus(t, c, "shop", id3)
		return st.State == store.DeployFailed && st.Settled && gone(t, c, cands)
	})
	settled := time.Since(killed)
	st = deployStatus(t, c, "shop", id3)
	if st.Error == nil || st.Error.Code != "abandoned" {
		t.Fatalf("abandoned deploy's status: %+v", st)
	}
	if id, _ := liveIDs(t, c, "shop"); id != id2 {
		t.Fatalf("live commit %s, want %s still", id, id2)
	}
	if !servesOnly(gw, "shop.example.com", v2IDs, 8) {
		t.Fatal("revision 2 stopped being served")
	}
	report = append(report, fmt.Sprintf("killed before the final commit: failed, candidates stopped after %s", settled.Round(100*time.Millisecond)))

	// 3. Ctrl-C while candidates warm up.
	p = c.startApply("apply (Ctrl-C before the final commit)", nil, applyArgs(c.manifest("slow.yaml", gwSlow))...)
	p.waitOutput(t, `\[4/9\] status`, 30*time.Second)
	id4 := deployIDRe.FindStringSubmatch(p.output())[1]
	eventually(t, 10*time.Second, "the slow candidates to start", func() bool {
		cands = cands[:0]
		for _, in := range c.instances("shop") {
			if in.DeployID == id4 {
				cands = append(cands, in)
			}
		}
		return len(cands) == 2
	})
	p.signal(syscall.SIGINT)
	<-p.done
	out := p.output()
	if p.cmd.ProcessState.ExitCode() != 1 || !strings.Contains(out, "was interrupted before the final commit") || !strings.Contains(out, "interrupted") {
		t.Fatalf("Ctrl-C before the commit: exit %d\n%s", p.cmd.ProcessState.ExitCode(), out)
	}
	st = deployStatus(t, c, "shop", id4)
	if st.State != store.DeployFailed || st.Error == nil || st.Error.Code != "interrupted" || !st.Settled {
		t.Fatalf("interrupted deploy's status: %+v", st)
	}
	if !gone(t, c, cands) {
		t.Fatal("the interrupted deploy's candidates are still there")
	}
	if id, _ := liveIDs(t, c, "shop"); id != id2 {
		t.Fatalf("live commit %s after an interrupt before the commit", id)
	}

	// 4. Ctrl-C after the final commit: the deploy is finished first.
	old := c.instances("shop")
	p = c.startApply("apply (Ctrl-C after the final commit)", nil,
		"deploy", "apply", "-f", c.manifest("v5.yaml", gwV1), "--lease-ttl", "2s", "--drain-grace", "3s", "--stop-grace", "2s")
	p.waitOutput(t, `\[8/9\] publish_routing`, 30*time.Second)
	p.signal(syscall.SIGINT)
	<-p.done
	out = p.output()
	if p.cmd.ProcessState.ExitCode() != 0 || !strings.Contains(out, "interrupted after the final commit") || !strings.Contains(out, "finished after the interrupt") {
		t.Fatalf("Ctrl-C after the commit: exit %d\n%s", p.cmd.ProcessState.ExitCode(), out)
	}
	id5, v5IDs := liveIDs(t, c, "shop")
	st = deployStatus(t, c, "shop", id5)
	if st.State != store.DeployCommitted || !st.Settled {
		t.Fatalf("deploy interrupted after its commit: %+v", st)
	}
	if !gone(t, c, old) || !servesOnly(gw, "shop.example.com", v5IDs, 8) {
		t.Fatal("after an interrupt past the commit the old instances must be gone and the new served")
	}

	close(stop)
	wg.Wait()
	if n := l.failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed: %v", n, n+l.ok.Load(), l.errs)
	}
	report = append(report, fmt.Sprintf("Ctrl-C on both sides of the commit; %d requests through the gateway, 0 failed", l.ok.Load()))
	t.Logf("\n%s", strings.Join(report, "\n"))
}

// A host belongs to one namespace: another's manifest routing it, in any
// spelling or through a covering wildcard, is refused at preview and apply
// with nothing written, while the owner's traffic goes on; once the owner
// stops routing it, it can be claimed.
func TestHostOwnershipAcrossNamespaces(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("shop.yaml", gwV1))...)
	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 4, stop)
	intruder := func(host string) string {
		return c.manifest("test.yaml", fmt.Sprintf(`
namespace: test
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [%q]}]
`, host))
	}
	ctx := context.Background()
	head := routingHead(t, c)
	for _, h := range []struct{ host, owned string }{
		{"SHOP.Example.COM.", "shop.example.com"},
		{"*.example.com", "*.shop.example.com"},
		{"a.shop.example.com", "*.shop.example.com"},
		{"*.b.shop.example.com", "*.shop.example.com"},
	} {
		for _, cmd := range [][]string{{"deploy", "preview", "-f", intruder(h.host)}, applyArgs(intruder(h.host))} {
			out, errOut, code := c.control(cmd...)
			if code != 1 || !strings.Contains(errOut, "error: host_owned: host ") || !strings.Contains(errOut, "owner: shop\n") ||
				!strings.Contains(errOut, "requester: test\n") || !strings.Contains(errOut, "owned_host: "+h.owned+"\n") {
				t.Fatalf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", cmd[1], h.host, code, out, errOut)
			}
		}
	}
	// Nothing written: no status, phase, lease, claim or routing event.
	locks := storetest.Bucket(t, c.store, c.store.Names.LocksBucket())
	phases := storetest.Bucket(t, c.store, c.store.Names.DeployPhasesBucket())
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	for _, kv := range []struct {
		name string
		n    func() int
	}{
		{"status", func() int { return countPrefix(t, statuses, "test.") }},
		{"phases", func() int { return countPrefix(t, phases, "test.") }},
		{"locks", func() int { return countPrefix(t, locks, store.DeployLockKey("test")) }},
	} {
		if n := kv.n(); n != 0 {
			t.Fatalf("a refused manifest wrote %d %s records", n, kv.name)
		}
	}
	if hs, _ := hosts.Owned(ctx, c.store, "test"); len(hs) != 0 {
		t.Fatalf("a refused manifest claimed %v", hs)
	}
	if h := routingHead(t, c); h != head {
		t.Fatalf("routing moved from %d to %d", head, h)
	}
	// The owner stops routing its wildcard: test may take a name under it.
	c.mustControl(applyArgs(c.manifest("shop2.yaml", strings.Replace(gwV1, `, "*.shop.example.com"`, "", 1)))...)
	if hs, _ := hosts.Owned(ctx, c.store, "shop"); !slices.Equal(hs, []string{"shop.example.com"}) {
		t.Fatalf("shop owns %v after dropping its wildcard", hs)
	}
	c.mustControl(applyArgs(intruder("a.shop.example.com"))...)
	_, testIDs := liveIDs(t, c, "test")
	eventually(t, 5*time.Second, "test's host to be served", func() bool { return servesOnly(gw, "a.shop.example.com", testIDs, 4) })
	close(stop)
	wg.Wait()
	if n := l.failed.Load(); n != 0 {
		t.Fatalf("the owner's traffic: %d of %d requests failed: %v", n, n+l.ok.Load(), l.errs)
	}
	// Destroying a namespace releases its hosts, stops its instances and
	// removes its routing; history shows it.
	testInsts := c.instances("test")
	out := c.mustControl("deploy", "destroy", "test", "--drain-grace", "100ms", "--stop-grace", "2s")
	if !strings.Contains(out, "destroying namespace test") {
		t.Fatalf("destroy:\n%s", out)
	}
	if hs, _ := hosts.Owned(ctx, c.store, "test"); len(hs) != 0 {
		t.Fatalf("a destroyed namespace owns %v", hs)
	}
	if !gone(t, c, testInsts) {
		t.Fatal("a destroyed namespace's instances still run")
	}
	eventually(t, 5*time.Second, "the destroyed namespace's host to stop being served", func() bool {
		code, _, err := gw.request("a.shop.example.com", "/")
		return err == nil && code != 200
	})
	if hist := c.mustControl("deploy", "history", "test"); !strings.Contains(hist, "destroy") {
		t.Fatalf("history does not show the destroy:\n%s", hist)
	}
	if _, errOut, code := c.control("deploy", "destroy", "test"); code != 1 || !strings.Contains(errOut, "destroyed") {
		t.Fatalf("destroying twice: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := c.control("deploy", "destroy", "nosuch"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("destroying an unknown namespace: exit %d\n%s", code, errOut)
	}
	t.Logf("owner's traffic during 8 refused manifests and two deploys: %d requests, 0 failed", l.ok.Load())
}

func countPrefix(t *testing.T, kv jetstream.KeyValue, prefix string) int {
	t.Helper()
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for k := range keys.Keys() {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// A dead machine with instances, removed with --force: it vanishes from
// machine ls, the projection, DNS and the mesh; its invite is void; the
// next apply succeeds without cleanup failures and places elsewhere.
func TestRemoveDeadMachine(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	c.join("m2")
	gw := c.startGateway("gw1")
	ctx := context.Background()
	// m2 is a mesh member too.
	peer := store.MeshPeerRecord{Version: store.RecordVersion, Machine: "m2", PublicKey: "k2", MeshIP: "10.100.0.2", RegisteredAt: time.Now()}
	if _, err := c.store.PutMeshPeer(ctx, &peer); err != nil {
		t.Fatal(err)
	}
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	onM2 := 0
	for _, in := range c.instances("shop") {
		if in.Machine == "m2" {
			onM2++
		}
	}
	if onM2 == 0 {
		t.Fatal("want an instance on m2")
	}
	if got := dig(t, gw.dns, "A", "m2.machines.edgeplane.internal"); len(got) != 1 {
		t.Fatalf("m2's DNS name before: %v", got)
	}
	// m2 burns: agent and instances gone.
	c.agents["m2"].stop(syscall.SIGKILL)
	killAgentInstances(c.agentDir("m2"))
	if _, errOut, code := c.control("machine", "rm", "m2"); code != 1 || !strings.Contains(errOut, "--force") {
		t.Fatalf("rm without --force: exit %d\n%s", code, errOut)
	}
	out := c.mustControl("machine", "rm", "m2", "--force", "--probe-timeout", "500ms")
	if !strings.Contains(out, "machine m2 removed (it did not answer)") || !strings.Contains(out, "its invite is void") {
		t.Fatalf("rm --force:\n%s", out)
	}
	if ls := c.mustControl("machine", "ls"); strings.Contains(ls, "m2") {
		t.Fatalf("machine ls still lists m2:\n%s", ls)
	}
	eventually(t, 5*time.Second, "m2's DNS name to go", func() bool { return len(dig(t, gw.dns, "A", "m2.machines.edgeplane.internal")) == 0 })
	if routes := routesOf(t, gw); strings.Contains(routes, `"m2"`) {
		t.Fatalf("the projection still routes to m2:\n%s", routes)
	}
	if _, err := c.store.MeshPeer(ctx, "m2"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("m2's mesh peer: %v", err)
	}
	invites := storetest.Bucket(t, c.store, c.store.Names.InvitesBucket())
	err := store.ListJSON(ctx, c.store, invites, ">", func(_ string, inv *store.Invite) error {
		if inv.UsedBy == "m2" {
			return fmt.Errorf("m2's invite is still there")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The next apply places on m1 with nothing to clean up.
	c.mustControl(applyArgs(c.manifest("v2.yaml", gwV2))...)
	id, ids := liveIDs(t, c, "shop")
	st := deployStatus(t, c, "shop", id)
	if len(st.Cleanup) != 0 || !st.Settled {
		t.Fatalf("the apply after rm: %+v", st)
	}
	for _, in := range c.instances("shop") {
		if in.Machine != "m1" {
			t.Fatalf("instance %s placed on %s", in.ID, in.Machine)
		}
	}
	eventually(t, 5*time.Second, "revision 2 to be served", func() bool { return servesOnly(gw, "shop.example.com", ids, 6) })
	if out, _, code := c.control("doctor", "--gateway", gw.admin, "--dns", gw.dns); code != 0 {
		t.Fatalf("doctor after the removal:\n%s", out)
	}
}

// An agent killed 2 s into a 30 s readiness wait: the apply fails within
// the RPC timeout + 2 s naming the machine, with no commit; the live
// machine's candidate is stopped; revision 1 is served throughout; the
// dead machine's candidate goes once its agent returns.
func TestDeadMachineFailsTheApplyFast(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	c.join("m2")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	live1, v1IDs := liveIDs(t, c, "shop")
	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 4, stop)
	const rpcTimeout = 3 * time.Second
	p := c.startApply("apply (m2 dies)", nil, applyArgs(c.manifest("slow.yaml", gwSlow), "--rpc-timeout", rpcTimeout.String())...)
	p.waitOutput(t, `\[4/9\] status`, 30*time.Second)
	waiting := time.Now()
	id := deployIDRe.FindStringSubmatch(p.output())[1]
	var cands []store.InstanceRecord
	eventually(t, 10*time.Second, "both candidates to start", func() bool {
		cands = cands[:0]
		for _, in := range c.instances("shop") {
			if in.DeployID == id {
				cands = append(cands, in)
			}
		}
		return len(cands) == 2
	})
	// The scenario, not a synchronisation: the agent dies 2 s into the
	// readiness wait.
	time.Sleep(time.Until(waiting.Add(2 * time.Second)))
	c.agents["m2"].stop(syscall.SIGKILL)
	killed := time.Now()
	<-p.done
	took := time.Since(killed)
	out := p.output()
	if p.cmd.ProcessState.ExitCode() != 1 || !strings.Contains(out, "machine m2 stopped answering") {
		t.Fatalf("apply: exit %d\n%s", p.cmd.ProcessState.ExitCode(), out)
	}
	if took > rpcTimeout+2*time.Second {
		t.Fatalf("the apply failed %s after the agent died; want within %s", took, rpcTimeout+2*time.Second)
	}
	st := deployStatus(t, c, "shop", id)
	if st.State != store.DeployFailed || st.Error == nil || st.Error.Detail["machine"] != "m2" {
		t.Fatalf("status: %+v", st)
	}
	if live, _ := liveIDs(t, c, "shop"); live != live1 {
		t.Fatalf("a commit was made: %s", live)
	}
	var onM1, onM2 []store.InstanceRecord
	for _, in := range cands {
		if in.Machine == "m1" {
			onM1 = append(onM1, in)
		} else {
			onM2 = append(onM2, in)
		}
	}
	if len(onM1) != 1 || len(onM2) != 1 || !gone(t, c, onM1) {
		t.Fatalf("m1's candidate must be gone: %+v", cands)
	}
	if !servesOnly(gw, "shop.example.com", v1IDs, 8) {
		t.Fatal("revision 1 is not served")
	}
	// m2's agent returns: its leftover candidate is stopped by the control
	// server, which kept the cleanup failure.
	c.restartAgent("m2")
	eventually(t, 20*time.Second, "m2's leftover candidate to be stopped", func() bool { return gone(t, c, onM2) })
	eventually(t, 10*time.Second, "the failed deploy to settle", func() bool { return deployStatus(t, c, "shop", id).Settled })
	close(stop)
	wg.Wait()
	if n := l.failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed: %v", n, n+l.ok.Load(), l.errs)
	}
	t.Logf("agent killed during readiness: apply failed %s later (RPC timeout %s); %d requests served by revision 1, 0 failed",
		took.Round(10*time.Millisecond), rpcTimeout, l.ok.Load())
}

// doctorRun runs `control doctor` and decodes its report.
func doctorRun(t *testing.T, c *cluster, gw *gateway) (*doctor.Report, int, string) {
	t.Helper()
	out, errOut, code := c.control("doctor", "-o", "json", "--gateway", gw.admin, "--dns", gw.dns)
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor: %v\n%s\n%s", err, out, errOut)
	}
	return &rep, code, out
}

// wantFinding fails unless rep has a problem in layer whose message
// matches re.
func wantFinding(t *testing.T, rep *doctor.Report, layer, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	for _, f := range rep.Findings {
		if f.Layer == layer && f.Severity == doctor.Problem && rx.MatchString(f.Message) {
			return
		}
	}
	b, _ := json.MarshalIndent(rep.Findings, "", "  ")
	t.Fatalf("no %s problem matching %q in\n%s", layer, re, b)
}

// control doctor is silent on a healthy fleet and finds each incoherence
// injected: an instance record for a dead process, a stray process, a
// gateway serving a stale snapshot.
func TestDoctorFindsIncoherence(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	ctx := context.Background()
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	healthy := func() {
		t.Helper()
		var rep *doctor.Report
		var code int
		var out string
		// The gateway reports every 2 s; give a fresh one a moment.
		eventually(t, 10*time.Second, "doctor to find the fleet coherent", func() bool {
			rep, code, out = doctorRun(t, c, gw)
			return code == 0
		})
		if !rep.Coherent || len(rep.Findings) != 0 || rep.Checked[doctor.LayerGateways] < 1 || rep.Checked[doctor.LayerDNS] < 2 {
			t.Fatalf("healthy fleet:\n%s", out)
		}
		text, _, _ := c.control("doctor", "--gateway", gw.admin, "--dns", gw.dns)
		if strings.Count(strings.TrimSpace(text), "\n") != 0 || !strings.HasPrefix(text, "coherent") {
			t.Fatalf("doctor on a healthy fleet printed more than its verdict:\n%s", text)
		}
	}
	healthy()

	// An instance record for a process that does not exist.
	ghost := store.InstanceRecord{Version: store.RecordVersion, ID: "ghost", Namespace: "shop", Service: "web", Machine: "m1",
		Address: "127.0.0.1", Port: 1, State: store.InstanceReady, DeployID: "d-none", CreatedAt: time.Now()}
	instances := storetest.Bucket(t, c.store, c.store.Names.InstancesBucket())
	if _, err := store.PutJSON(ctx, instances, ghost.Key(), &ghost); err != nil {
		t.Fatal(err)
	}
	rep, code, _ := doctorRun(t, c, gw)
	if code != 1 || rep.Coherent {
		t.Fatalf("doctor exit %d with a ghost record", code)
	}
	wantFinding(t, rep, doctor.LayerMachines, `record ghost .* says ready, but no such process runs there`)
	wantFinding(t, rep, doctor.LayerInstances, `record ghost on m1 .* belongs to no live commit`)
	if err := instances.Delete(ctx, ghost.Key()); err != nil {
		t.Fatal(err)
	}

	// A stray: a running instance whose record is gone.
	insts := c.instances("shop")
	stray := insts[0]
	if err := instances.Delete(ctx, stray.Key()); err != nil {
		t.Fatal(err)
	}
	rep, code, _ = doctorRun(t, c, gw)
	if code != 1 {
		t.Fatalf("doctor exit %d with a stray", code)
	}
	wantFinding(t, rep, doctor.LayerMachines, `runs instance `+stray.ID+` .* no record: a stray`)
	wantFinding(t, rep, doctor.LayerInstances, `instance `+stray.ID+` on m1 has no record`)
	if _, err := store.PutJSON(ctx, instances, stray.Key(), &stray); err != nil {
		t.Fatal(err)
	}

	// A lease whose holder, a process of this host, is gone; a host
	// claimed by a namespace that does not route it.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	lease, err := c.store.AcquireLease(ctx, store.DeployLockKey("other"), store.LeaseOptions{
		TTL: 30 * time.Second, Holder: fmt.Sprintf("%s:%d", store.HostName("localhost"), dead.Process.Pid), Purpose: "deploy d-dead"})
	if err != nil {
		t.Fatal(err)
	}
	claim := store.HostClaim{Version: store.RecordVersion, Host: "orphan.example.com", Namespace: "shop", Since: time.Now()}
	hostClaims := storetest.Bucket(t, c.store, c.store.Names.HostsBucket())
	if _, err := store.PutJSON(ctx, hostClaims, store.HostKey(claim.Host), &claim); err != nil {
		t.Fatal(err)
	}
	rep, _, _ = doctorRun(t, c, gw)
	wantFinding(t, rep, doctor.LayerLeases, `held by .*:\d+ \(deploy d-dead\), a process of this host that no longer runs`)
	wantFinding(t, rep, doctor.LayerHosts, `owned by shop, which no longer routes it`)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hostClaims.Delete(ctx, store.HostKey(claim.Host)); err != nil {
		t.Fatal(err)
	}
	healthy()

	// A gateway fed a stale snapshot: stopped, the store moves on, and it
	// starts again from its snapshot cut off from NATS.
	gw.proc.stop(syscall.SIGTERM)
	c.mustControl(applyArgs(c.manifest("v2.yaml", gwV2))...)
	cfgPath := filepath.Join(gw.dir, "caddy.json")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(b), c.url, "nats://127.0.0.1:1", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := c.restartGateway(gw)
	rep, code, _ = doctorRun(t, c, stale)
	if code != 1 {
		t.Fatalf("doctor exit %d with a stale gateway", code)
	}
	wantFinding(t, rep, doctor.LayerGateways, `serves a stale view while disconnected from NATS at sequence \d+, the store is at \d+ .*shop/web upstreams`)
	wantFinding(t, rep, doctor.LayerDNS, `answers edgeplane.internal. from routing sequence`)
	stale.proc.stop(syscall.SIGTERM)
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	gw = c.restartGateway(gw)
	healthy()
}

// control mesh rotate asks a node (or every node) for a new key through
// its peer record, reports who rotated, and says so when a node did not
// within --wait; an unknown machine is a clear error and asks nobody.
func TestMeshRotateCommand(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	for _, m := range []string{"m1", "m2"} {
		peer := store.MeshPeerRecord{Version: store.RecordVersion, Machine: m, PublicKey: m + "key", MeshIP: "10.100.0." + m[1:], RegisteredAt: time.Now()}
		if _, err := c.store.PutMeshPeer(ctx, &peer); err != nil {
			t.Fatal(err)
		}
	}
	if _, errOut, code := c.control("mesh", "rotate", "--machine", "ghost"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("rotate ghost: exit %d\n%s", code, errOut)
	}
	out := c.mustControl("mesh", "rotate", "--machine", "m1", "--wait", "0")
	if !strings.Contains(out, "m1  asked") {
		t.Fatalf("rotate m1:\n%s", out)
	}
	rec, err := c.store.MeshPeer(ctx, "m1")
	if err != nil || !rec.RotationDue() {
		t.Fatalf("m1's record after the request: %+v %v", rec, err)
	}
	if other, err := c.store.MeshPeer(ctx, "m2"); err != nil || other.RotationDue() {
		t.Fatalf("m2 was asked too: %+v %v", other, err)
	}
	// No meshd runs here: nobody rotates within --wait.
	out, errOut, code := c.control("mesh", "rotate", "--wait", "500ms", "-o", "json")
	var got []struct {
		Machine string
		Rotated bool
	}
	if code != 1 || !strings.Contains(errOut, "2 of 2 nodes did not rotate within 500ms") || json.Unmarshal([]byte(out), &got) != nil || len(got) != 2 {
		t.Fatalf("rotate all: exit %d\n%s\n%s", code, out, errOut)
	}
}
