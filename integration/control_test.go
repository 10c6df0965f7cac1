package integration

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const helloV1 = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 2
    env: {VERSION: "1"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
  api:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com], path_prefixes: [/api]}]
`

// v2 changes web only; api must keep its instance.
var helloV2 = strings.Replace(helloV1, `VERSION: "1"`, `VERSION: "2"`, 1)

// apiChange changes api only; web keeps its instances on both machines.
var apiChange = strings.Replace(helloV1, "api:\n    command: [\"@HELLO@\"]", "api:\n    command: [\"@HELLO@\"]\n    env: {API: \"2\"}", 1)

func statusOf(t *testing.T, c *cluster, ns string) (latest store.DeployStatus, phases []store.PhaseRecord) {
	t.Helper()
	var views []struct {
		Latest *store.DeployStatus `json:"latest"`
		Phases []store.PhaseRecord `json:"phases"`
	}
	out := c.mustControl("deploy", "status", ns, "-o", "json")
	if err := json.Unmarshal([]byte(out), &views); err != nil || len(views) != 1 || views[0].Latest == nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return *views[0].Latest, views[0].Phases
}

func routingHead(t *testing.T, c *cluster) uint64 {
	t.Helper()
	routing := storetest.Stream(t, c.store, c.store.Names.RoutingEventsStream())
	info, err := routing.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func allAnswer(t *testing.T, insts []store.InstanceRecord) {
	t.Helper()
	for _, in := range insts {
		body, err := get(t, addrOf(in))
		if err != nil {
			t.Fatalf("instance %s at %s: %v", in.ID, addrOf(in), err)
		}
		if !strings.Contains(body, `"instance":"`+in.ID+`"`) {
			t.Fatalf("instance %s answered %s", in.ID, body)
		}
	}
}

func TestApplyHappyPathRedeployRollback(t *testing.T) {
	c := newCluster(t)
	c.join("m1", "--region", "eu", "--label", "tier=edge")
	c.join("m2", "--region", "eu")

	ls := c.mustControl("machine", "ls")
	if len(lines(ls, " fresh (")) != 2 || !strings.Contains(ls, "tier=edge") {
		t.Fatalf("machine ls:\n%s", ls)
	}
	if probed := c.mustControl("machine", "ls", "--probe"); len(lines(probed, "yes (")) != 2 {
		t.Fatalf("machine ls --probe:\n%s", probed)
	}

	// Preview writes nothing.
	prev := c.mustControl("deploy", "preview", "-f", c.manifest("v1.yaml", helloV1))
	if !strings.Contains(prev, "3 to start, 0 to keep, 0 to stop") {
		t.Fatalf("preview:\n%s", prev)
	}
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	if keys, _ := statuses.ListKeys(context.Background()); keys != nil {
		for k := range keys.Keys() {
			t.Fatalf("preview wrote status %s", k)
		}
	}

	out := c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	for i, step := range []string{"preview", "lease", "probe", "status", "start_candidates", "checkpoint", "final_commit", "publish_routing", "drain_old"} {
		if !strings.Contains(out, "["+string(rune('1'+i))+"/9] "+step) {
			t.Fatalf("apply output lacks step %d %s:\n%s", i+1, step, out)
		}
	}
	st, phases := statusOf(t, c, "shop")
	if st.State != store.DeployCommitted || !st.RoutingPublished || st.Revision != 1 || len(phases) != 9 {
		t.Fatalf("status after v1: %+v (%d phases)", st, len(phases))
	}
	v1 := c.instances("shop")
	if len(v1) != 3 {
		t.Fatalf("want 3 instances, got %d", len(v1))
	}
	machinesUsed := map[string]int{}
	for _, in := range v1 {
		if in.State != store.InstanceReady {
			t.Fatalf("instance %s is %s", in.ID, in.State)
		}
		if in.Service == "web" {
			machinesUsed[in.Machine]++
		}
	}
	if len(machinesUsed) != 2 {
		t.Fatalf("web's two replicas should spread over both machines: %v", machinesUsed)
	}
	allAnswer(t, v1)

	// v2 changes web only: web's instances are replaced, api's kept.
	out = c.mustControl("deploy", "apply", "-f", c.manifest("v2.yaml", helloV2), "--drain-grace", "100ms")
	if !strings.Contains(out, "2 to start, 1 to keep, 2 to stop") {
		t.Fatalf("v2 plan:\n%s", out)
	}
	v2 := c.instances("shop")
	if len(v2) != 3 {
		t.Fatalf("after v2 want 3 instances, got %+v", v2)
	}
	var apiV1, apiV2 string
	for _, in := range v1 {
		if in.Service == "api" {
			apiV1 = in.ID
		}
	}
	for _, in := range v2 {
		if in.Service == "api" {
			apiV2 = in.ID
		}
		if in.Service == "web" && in.Revision != 2 {
			t.Fatalf("web instance %s at revision %d, want 2", in.ID, in.Revision)
		}
	}
	if apiV1 != apiV2 {
		t.Fatalf("unchanged api was restarted: %s -> %s", apiV1, apiV2)
	}
	for _, in := range v1 {
		if in.Service == "web" {
			if _, err := get(t, addrOf(in)); err == nil {
				t.Fatalf("old web instance %s still answers after the drain", in.ID)
			}
		}
	}
	allAnswer(t, v2)

	// History and rollback: a new deploy of the first commit's spec.
	hist := c.mustControl("deploy", "history", "shop")
	if len(lines(hist, " 1 ")) == 0 || len(lines(hist, " 2 ")) == 0 {
		t.Fatalf("history:\n%s", hist)
	}
	out = c.mustControl("deploy", "rollback", "shop", "--drain-grace", "100ms")
	if !strings.Contains(out, "rolling back shop to commit") {
		t.Fatalf("rollback:\n%s", out)
	}
	st, _ = statusOf(t, c, "shop")
	if st.Revision != 3 || st.RollbackOf == "" || st.State != store.DeployCommitted {
		t.Fatalf("status after rollback: %+v", st)
	}
	live, err := c.store.LiveCommit(context.Background(), "shop")
	if err != nil || live.Manifest.Services["web"].Env["VERSION"] != "1" {
		t.Fatalf("live commit after rollback: %+v %v", live, err)
	}
	allAnswer(t, c.instances("shop"))
}

func TestApplyBusyLockNamesHolder(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	ctx := context.Background()
	l, err := c.store.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 30 * time.Second, Holder: "ops-laptop:4242"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	start := time.Now()
	_, errOut, code := c.control("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1))
	if code != 1 || !strings.Contains(errOut, "busy") || !strings.Contains(errOut, "ops-laptop:4242") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("busy apply took %s; it must fail at once", el)
	}
	if len(c.instances("shop")) != 0 {
		t.Fatal("a refused apply started instances")
	}
	// The JSON form is structured.
	_, errOut, _ = c.control("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "-o", "json")
	var e struct{ Error store.Error }
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || e.Error.Code != "busy" || e.Error.Detail["holder"] != "ops-laptop:4242" {
		t.Fatalf("json error: %v\n%s", err, errOut)
	}
}

func TestDeadAgentFailsBeforeWriting(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	m2 := c.join("m2")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	statusesBefore := countKeys(t, statuses)
	headBefore := routingHead(t, c)

	m2.stop(syscall.SIGKILL) // its instances keep running, but nobody answers for m2
	ls := c.mustControl("machine", "ls", "--probe")
	if len(lines(ls, "no: no_responders")) != 1 {
		t.Fatalf("machine ls should show m2 unreachable:\n%s", ls)
	}
	start := time.Now()
	if apiChange == helloV1 {
		t.Fatal("apiChange manifest did not change api")
	}
	_, errOut, code := c.control("deploy", "apply", "-f", c.manifest("api.yaml", apiChange), "--probe-timeout", "1s")
	el := time.Since(start)
	if code != 1 || !strings.Contains(errOut, "rpc_failure") || !strings.Contains(errOut, "m2") {
		t.Fatalf("exit %d stderr:\n%s", code, errOut)
	}
	if el > 8*time.Second {
		t.Fatalf("RpcFailure took %s", el)
	}
	if n := countKeys(t, statuses); n != statusesBefore {
		t.Fatalf("a deploy that failed its probe wrote status (%d -> %d keys)", statusesBefore, n)
	}
	if h := routingHead(t, c); h != headBefore {
		t.Fatalf("routing events published by a failed probe: %d -> %d", headBefore, h)
	}
}

func TestFailedReadinessKeepsOldRevision(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	before := c.instances("shop")
	headBefore := routingHead(t, c)

	bad := strings.Replace(helloV2, `VERSION: "2"`, `VERSION: "2", HELLO_READY: fail`, 1)
	bad = strings.Replace(bad, "timeout: 10s}\n    routes: [{hosts: [shop.example.com]}]", "timeout: 1s}\n    routes: [{hosts: [shop.example.com]}]", 1)
	out, errOut, code := c.control("deploy", "apply", "-f", c.manifest("bad.yaml", bad))
	if code != 1 || !strings.Contains(errOut, "never became ready") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "the previous revision keeps serving") {
		t.Fatalf("apply output:\n%s", out)
	}
	st, phases := statusOf(t, c, "shop")
	if st.State != store.DeployFailed || st.Error == nil || st.CommitSeq != 0 {
		t.Fatalf("status: %+v", st)
	}
	for _, p := range phases {
		if p.Index >= 6 && p.State != store.PhaseSkipped {
			t.Fatalf("phase %d %s is %s after an abort", p.Index, p.Name, p.State)
		}
	}
	if h := routingHead(t, c); h != headBefore {
		t.Fatalf("a failed deploy published routing events: %d -> %d", headBefore, h)
	}
	after := c.instances("shop")
	if len(after) != len(before) {
		t.Fatalf("candidates left behind: %d instances before, %d after", len(before), len(after))
	}
	allAnswer(t, before)
	if live, _ := c.store.LiveCommit(context.Background(), "shop"); live.Revision != 1 {
		t.Fatalf("live revision %d, want 1", live.Revision)
	}
}

func TestAgentRestartAdoptsInstances(t *testing.T) {
	c := newCluster(t)
	a := c.join("m1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	before := c.instances("shop")
	a.stop(syscall.SIGKILL)
	allAnswer(t, before) // instances outlive their agent

	r := c.restartAgent("m1")
	if got := len(lines(r.output(), "adopted instance")); got != len(before) {
		t.Fatalf("adopted %d of %d instances:\n%s", got, len(before), r.output())
	}
	after := c.instances("shop")
	for i := range before {
		if before[i].ID != after[i].ID || before[i].PID != after[i].PID || after[i].State != store.InstanceReady {
			t.Fatalf("instance changed across the agent restart: %+v -> %+v", before[i], after[i])
		}
	}
	allAnswer(t, after)
	// The adopted instances are still under control: a redeploy stops them.
	c.mustControl("deploy", "apply", "-f", c.manifest("v2.yaml", helloV2), "--drain-grace", "100ms")
	for _, in := range before {
		if in.Service == "web" {
			if _, err := get(t, addrOf(in)); err == nil {
				t.Fatalf("adopted instance %s still answers after being replaced", in.ID)
			}
		}
	}
}

func TestInvalidManifestChangesNothing(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	bad := c.manifest("bad.yaml", `
namespace: Shop
services:
  web:
    replicas: -1
    port: 99999
    env: {PORT: "1"}
    readiness: {path: healthz}
    routes: [{hosts: ["a.com:80"], path_prefixes: [api]}]
`)
	_, errOut, code := c.control("deploy", "apply", "-f", bad)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"namespace: must be a DNS label", "services.web.command: required", "services.web.replicas: must be >= 0",
		"services.web.port", "services.web.env.PORT: reserved", "services.web.readiness.path",
		"services.web.routes[0].hosts[0]", "services.web.routes[0].path_prefixes[0]",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	// Policy and rollout values, at preview: each with its field path.
	badPolicy := c.manifest("bad-policy.yaml", `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    routes:
      - hosts: [shop.example.com]
        strip_prefix: true
        request_headers: {set: {Transfer-Encoding: chunked}}
        max_request_body: huge
        timeouts: {response_header: 3h}
        retries: {on_status: [302]}
rollout:
  steps: [{weight: 150, hold: 0s}]
  limits: {max_5xx_ratio: 2}
  match: {header: X-Canary}
`)
	_, errOut, code = c.control("deploy", "preview", "-f", badPolicy)
	if code != 1 {
		t.Fatalf("preview of invalid policy: exit %d", code)
	}
	for _, want := range []string{
		"services.web.routes[0].strip_prefix:", "services.web.routes[0].request_headers.set.Transfer-Encoding:",
		"services.web.routes[0].max_request_body:", "services.web.routes[0].timeouts.response_header:",
		"services.web.routes[0].retries.on_status[0]:", "rollout.steps[0].weight:", "rollout.steps[0].hold:",
		"rollout.limits.max_5xx_ratio:", "rollout.match.value:",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("preview's stderr lacks %q:\n%s", want, errOut)
		}
	}
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	if n := countKeys(t, statuses); n != 0 {
		t.Fatalf("an invalid manifest wrote %d status records", n)
	}
	locks := storetest.Bucket(t, c.store, c.store.Names.LocksBucket())
	if keys, err := locks.ListKeys(context.Background()); err == nil {
		for k := range keys.Keys() {
			if k != store.FleetStatusLockKey { // the control server's own
				t.Fatalf("an invalid manifest took lock %s", k)
			}
		}
	}
}

// A crash right after the final commit: the deploy is live, so the next
// operation must publish its routing events, saying so.
func TestCrashAfterFinalCommitIsCompleted(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	headBefore := routingHead(t, c)
	cmdOut, _, code := c.controlEnv([]string{"EDGEPLANE_FAILPOINTS=after_final_commit"}, "deploy", "apply", "-f", c.manifest("v1.yaml", helloV1))
	if code != 97 {
		t.Fatalf("failpoint exit %d:\n%s", code, cmdOut)
	}
	if h := routingHead(t, c); h != headBefore {
		t.Fatal("routing events went out before the crash point")
	}
	live, err := c.store.LiveCommit(context.Background(), "shop")
	if err != nil {
		t.Fatalf("the final commit must exist: %v", err)
	}
	// Restarting the server completes it.
	c.server.stop(syscall.SIGTERM)
	port := strings.TrimPrefix(c.url, "nats://")
	c.startServer(port)
	c.server.waitOutput(t, "completed committed deploy "+live.ID, 20*time.Second)
	st, _ := statusOf(t, c, "shop")
	if st.State != store.DeployCommitted || !st.RoutingPublished || st.RoutingSeq <= headBefore {
		t.Fatalf("status after completion: %+v", st)
	}
}

func countKeys(t *testing.T, kv jetstream.KeyValue) int {
	t.Helper()
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n
}

// An agent joined without --advertise uses its machine's mesh IP when meshd
// registered one, and its instances listen there.
func TestAgentAdvertisesMeshIP(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	peer := store.MeshPeerRecord{Version: store.RecordVersion, Machine: "m9", PublicKey: "k", MeshIP: "127.0.0.9", RegisteredAt: time.Now()}
	if _, err := c.store.PutMeshPeer(ctx, &peer); err != nil {
		t.Fatal(err)
	}
	c.join("m9")
	var m store.MachineRecord
	machines := storetest.Bucket(t, c.store, c.store.Names.MachinesBucket())
	if _, err := store.GetJSON(ctx, machines, "m9", &m); err != nil || m.Address != "127.0.0.9" {
		t.Fatalf("machine record %+v %v", m, err)
	}
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "100ms")
	insts := c.instances("shop")
	for _, in := range insts {
		if in.Address != "127.0.0.9" {
			t.Fatalf("instance %s at %s, want the mesh IP", in.ID, in.Address)
		}
	}
	allAnswer(t, insts)
}

// Changing only a service's replica count or its routes says nothing new
// about what an instance runs: the instances that stay are the same
// processes (same IDs, same PIDs), and the new routes are published.
func TestScaleAndRouteChangesKeepInstances(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	const two = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 2
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`
	c.mustControl("deploy", "apply", "-f", c.manifest("two.yaml", two), "--drain-grace", "100ms")
	before := bySlot(t, c.instances("shop"), 2)

	one := strings.Replace(two, "replicas: 2", "replicas: 1", 1)
	out := c.mustControl("deploy", "apply", "-f", c.manifest("one.yaml", one), "--drain-grace", "100ms")
	if !strings.Contains(out, "0 to start, 1 to keep, 1 to stop") {
		t.Fatalf("scaling 2 → 1:\n%s", out)
	}
	after := bySlot(t, c.instances("shop"), 1)
	sameProcess(t, before[0], after[0])
	if _, err := get(t, addrOf(before[1])); err == nil {
		t.Fatalf("slot 1's instance %s still answers after the scale-down", before[1].ID)
	}

	routed := strings.Replace(one, "hosts: [shop.example.com]", "hosts: [shop.example.com, www.shop.example.com], path_prefixes: [/, /api]", 1)
	out = c.mustControl("deploy", "apply", "-f", c.manifest("routed.yaml", routed), "--drain-grace", "100ms")
	if !strings.Contains(out, "0 to start, 1 to keep, 0 to stop") {
		t.Fatalf("adding a host:\n%s", out)
	}
	sameProcess(t, before[0], bySlot(t, c.instances("shop"), 1)[0])
	st, err := c.store.LoadRouting(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, ev := range st.Services {
		if ev.Namespace == "shop" && ev.Service == "web" && len(ev.Routes) > 0 {
			hosts = ev.Routes[0].Hosts
			if len(ev.Endpoints) != 1 || ev.Endpoints[0].InstanceID != before[0].ID {
				t.Errorf("routing endpoints %+v, want only %s", ev.Endpoints, before[0].ID)
			}
		}
	}
	if !slices.Contains(hosts, "www.shop.example.com") {
		t.Fatalf("the new host is not in the routing: %v", hosts)
	}
}

// bySlot returns a namespace's instances indexed by slot, failing unless
// there are n, all ready.
func bySlot(t *testing.T, insts []store.InstanceRecord, n int) []store.InstanceRecord {
	t.Helper()
	out := make([]store.InstanceRecord, n)
	for _, in := range insts {
		if in.Slot >= n || in.State != store.InstanceReady || out[in.Slot].ID != "" {
			t.Fatalf("want %d ready instances, one per slot: %+v", n, insts)
		}
		out[in.Slot] = in
	}
	return out
}

// sameProcess fails unless after is before's instance, still the same
// running process.
func sameProcess(t *testing.T, before, after store.InstanceRecord) {
	t.Helper()
	if after.ID != before.ID || after.PID != before.PID || before.PID == 0 {
		t.Fatalf("slot %d was replaced: %s (pid %d) → %s (pid %d)", before.Slot, before.ID, before.PID, after.ID, after.PID)
	}
	if err := syscall.Kill(before.PID, 0); err != nil {
		t.Fatalf("instance %s's process %d: %v", before.ID, before.PID, err)
	}
	if _, err := get(t, addrOf(after)); err != nil {
		t.Fatalf("instance %s: %v", after.ID, err)
	}
}
