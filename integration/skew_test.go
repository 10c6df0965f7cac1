package integration

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Mixed fleets, as a rolling upgrade runs them: this tree's binaries beside
// the previous release's (release_test.go builds it from its tag), under a
// steady load through the gateway, with deploys during the mix. The skew
// policy (README "Versions and upgrades") is what they hold to: agents,
// gateways and meshd up to one minor release behind the control plane work
// with it; an agent ahead of an old control plane still gets its instances
// routed.

// skewCanary is revision VERSION of web as a canary of one step, judged by
// the gateways' own counters.
func skewCanary(version string) string {
	return strings.Replace(gwV1, `VERSION: "1"`, `VERSION: "`+version+`"`, 1) + `rollout:
  steps: [{weight: 50, hold: 4s}]
  limits: {min_requests: 20, max_p99_ratio: 4}
`
}

// newClusterOn is newCluster with the server (and the CLI) of binary
// serverBin.
func newClusterOn(t *testing.T, serverBin string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverBin: serverBin}
	roomForOldStore(t, c.serverDir())
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	return c
}

// roomForOldStore gives a storage node of a release before v0.39.0 a
// filesystem it can start on. Such a node let JetStream take three quarters
// of the disk's free space as its limit, and provisioning reserves every
// stream's limit whole (store.ReservedBytes), so it refused to start with
// storage_full on a disk with less than about 49 GB free: a fact about the
// machine, not the skew under test. Below that, dir becomes a tmpfs whose
// size is only a ceiling (the test writes a few megabytes); without root to
// mount one the test is skipped, saying why.
func roomForOldStore(t *testing.T, dir string) {
	t.Helper()
	need := store.ReservedBytes()/3*4 + 1<<30
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free >= need {
		return
	}
	if os.Geteuid() != 0 {
		t.Skipf("a storage node of a release before v0.39.0 needs %d GB free on %s to start (or root, to give it a tmpfs)", need>>30, dir)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", need)); err != nil {
		t.Fatalf("tmpfs for the old release's store: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// startGatewayBin is startGateway running caddy binary bin.
func (c *cluster) startGatewayBin(bin, name string) *gateway {
	g, path, env := c.gatewayConfig(name, map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	g.proc = start(c.t, "caddy "+name, env, bin, "run", "--config", path)
	g.waitConnected(c.t, name)
	return g
}

// skewLoad is a steady load through one or more gateways for the length of
// a test.
type skewLoad struct {
	stop  chan struct{}
	loads []*load
	wgs   []*sync.WaitGroup
}

func startSkewLoad(gws ...*gateway) *skewLoad {
	s := &skewLoad{stop: make(chan struct{})}
	for _, g := range gws {
		l, wg := g.runLoad("shop.example.com", 4, s.stop)
		s.loads, s.wgs = append(s.loads, l), append(s.wgs, wg)
	}
	return s
}

// end stops the load and fails the test if a request failed or too few
// went through; it returns what each gateway served.
func (s *skewLoad) end(t *testing.T) string {
	t.Helper()
	close(s.stop)
	var report []string
	for i, l := range s.loads {
		s.wgs[i].Wait()
		report = append(report, fmt.Sprintf("%d requests, %d failed", l.ok.Load()+l.failed.Load(), l.failed.Load()))
		if l.failed.Load() != 0 || l.ok.Load() < 100 {
			t.Errorf("load through gateway %d: %d ok, %d failed: %v", i+1, l.ok.Load(), l.failed.Load(), l.errs)
		}
	}
	return strings.Join(report, "; ")
}

// allRouted waits until no instance is wrongly left out of routing: the
// live commit of shop has replicas slots, each slot's instance is ready in
// the records (as the CLI of the control plane reads them) and answers
// through every gateway, and the gateways route nothing else. It returns
// the live instance IDs.
func allRouted(t *testing.T, c *cluster, replicas int, gws ...*gateway) []string {
	t.Helper()
	var ids []string
	var why string
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, ids = liveIDs(t, c, "shop")
		if why = routedWhyNot(c, ids, replicas, gws); why == "" {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s an instance is still wrongly out of routing (or in it): %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func routedWhyNot(c *cluster, ids []string, replicas int, gws []*gateway) string {
	if len(ids) != replicas {
		return fmt.Sprintf("the live commit routes %v, want %d instances", ids, replicas)
	}
	ready := map[string]bool{}
	for _, in := range c.instances("shop") {
		ready[in.ID] = in.State == store.InstanceReady
	}
	for _, id := range ids {
		if !ready[id] {
			return fmt.Sprintf("live instance %s is not ready in the records", id)
		}
	}
	for i, g := range gws {
		if st, err := g.projection(); err != nil || st.Routable != replicas || st.LastError != "" {
			return fmt.Sprintf("gateway %d's projection: %+v %v", i+1, st, err)
		}
		seen := map[string]bool{}
		for range 10 * replicas {
			code, inst, err := g.request("shop.example.com", "/")
			if err != nil || code != 200 {
				return fmt.Sprintf("gateway %d answered %d %q %v", i+1, code, inst, err)
			}
			seen[inst] = true
		}
		for id := range seen {
			if !slices.Contains(ids, id) {
				return fmt.Sprintf("gateway %d routes %s, not in the live commit %v", i+1, id, ids)
			}
		}
		if len(seen) != len(ids) {
			return fmt.Sprintf("gateway %d reached %d of the live instances %v", i+1, len(seen), ids)
		}
	}
	return ""
}

// canaryPassed applies the manifest in file, a canary, and checks that its
// one step passed on the gateways' counters and the revision was committed.
func canaryPassed(t *testing.T, c *cluster, file string) {
	t.Helper()
	out := c.mustControl(applyArgs(file)...)
	id := canaryApplyRe.FindStringSubmatch(out)[1]
	st := deployStatus(t, c, "shop", id)
	if st.State != store.DeployCommitted || len(st.Canary) != 1 || st.Canary[0].Verdict != store.CanaryPassed {
		t.Fatalf("the canary under skew: %+v\n%s", st, out)
	}
}

// servedVersion fails the test unless 20 requests through g all reach
// revision want.
func servedVersion(t *testing.T, g *gateway, want string) {
	t.Helper()
	for range 20 {
		if code, v, err := g.versionOf(gwClient, nil); err != nil || code != 200 || v != want {
			t.Fatalf("through %s: %d, revision %q, %v; want revision %s", g.http, code, v, err, want)
		}
	}
}

// A control plane of this tree drives a fleet still on the previous
// release (agents, the gateway, meshd): a deploy, a canary judged on the
// old gateway's counters and a rollback, under load, without a failed
// request or an instance left out of routing; the old meshd pair meshes
// through the new control plane.
func TestSkewNewControlPlaneOldFleet(t *testing.T) {
	buildExtra(t)
	old := previousRelease(t)
	c := newCluster(t)
	c.agentBin = old.control
	c.join("m1")
	c.join("m2")
	meshes := []*meshNode{c.startMeshBin(old.meshd, "m1"), c.startMeshBin(old.meshd, "m2")}
	gw := c.startGatewayBin(old.caddy, "gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	allRouted(t, c, 2, gw)

	load := startSkewLoad(gw)
	c.mustControl(applyArgs(c.manifest("v2.yaml", gwV2))...)
	allRouted(t, c, 2, gw)
	servedVersion(t, gw, "2")
	canaryPassed(t, c, c.manifest("v3.yaml", skewCanary("3")))
	allRouted(t, c, 2, gw)
	servedVersion(t, gw, "3")
	if out := c.mustControl("deploy", "rollback", "shop", "--drain-grace", "500ms", "--stop-grace", "2s"); !strings.Contains(out, "rolling back shop") {
		t.Fatalf("rollback:\n%s", out)
	}
	allRouted(t, c, 2, gw)
	servedVersion(t, gw, "2")
	report := load.end(t)

	for i, m := range meshes {
		peer := meshes[1-i].id
		eventually(t, 30*time.Second, "old meshd "+m.id+" handshaking with "+peer, func() bool {
			return m.handshakeWith(t, peer, time.Time{})
		})
	}
	// The agents really were the old release.
	v := c.fleetVersions()
	for _, id := range []string{"m1", "m2"} {
		if v[id].Release != old.version() {
			t.Fatalf("machine %s reports %q, want the previous release %s", id, v[id].Release, old.version())
		}
	}
	t.Logf("control plane of this tree, agents, gateway and meshd of %s: deploy, canary, rollback under load: %s", old.tag, report)
}

// A control plane still on the previous release (server and CLI) with an
// agent of this tree, as during an upgrade done out of order: deploys go
// through and the new agent's ready instances are routed. It passes only if
// the old control plane reads them ready: an instance the old CLI took for
// starting would fail the deploy's readiness wait, and one the old server
// left out of the routing would be missed through the gateway.
func TestSkewOldControlPlaneRoutesANewAgent(t *testing.T) {
	old := previousRelease(t)
	c := newClusterOn(t, old.control)
	c.join("m1")
	gw := c.startGatewayBin(old.caddy, "gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	allRouted(t, c, 2, gw)

	load := startSkewLoad(gw)
	c.mustControl(applyArgs(c.manifest("v2.yaml", gwV2))...)
	allRouted(t, c, 2, gw)
	servedVersion(t, gw, "2")
	report := load.end(t)
	if out := c.mustControl("version"); !strings.Contains(out, " "+old.version()+" ") {
		t.Fatalf("the CLI is not the previous release: %s", out)
	}
	t.Logf("control plane of %s, agent of this tree: deploy under load: %s", old.tag, report)
}

// A gateway of the previous release meets the routing events of this
// tree's control plane (commits, a canary's weights, the seals on them):
// it applies every one, as a gateway of this tree beside it does, and
// serves through the deploy and the canary without a failed request.
func TestSkewOldGatewayAppliesNewRoutingEvents(t *testing.T) {
	old := previousRelease(t)
	c := newCluster(t)
	c.join("m1")
	oldGW := c.startGatewayBin(old.caddy, "gw-old")
	newGW := c.startGateway("gw-new")
	c.mustControl(applyArgs(c.manifest("v1.yaml", gwV1))...)
	allRouted(t, c, 2, oldGW, newGW)

	load := startSkewLoad(oldGW, newGW)
	canaryPassed(t, c, c.manifest("v2.yaml", skewCanary("2")))
	allRouted(t, c, 2, oldGW, newGW)
	servedVersion(t, oldGW, "2")
	report := load.end(t)
	eventually(t, 10*time.Second, "both gateways at the stream's head", func() bool {
		o, err1 := oldGW.projection()
		n, err2 := newGW.projection()
		return err1 == nil && err2 == nil && o.AppliedSeq == o.StreamHead && n.AppliedSeq == n.StreamHead && o.AppliedSeq == n.AppliedSeq
	})
	for _, bad := range []string{"refus", "skipping unusable routing event"} {
		if strings.Contains(strings.ToLower(oldGW.proc.output()), bad) {
			t.Fatalf("the old gateway's log says %q:\n%s", bad, oldGW.proc.output())
		}
	}
	t.Logf("gateway of %s beside one of this tree, canary under load (old gateway; new gateway): %s", old.tag, report)
}
