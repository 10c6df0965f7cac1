package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// controlVersions are the control binaries buildControlVersion built,
// by version: one build per test run, shared by every test that runs it
// (the same tree and flags make the same binary).
var controlVersions struct {
	mu    sync.Mutex
	built map[string]string
}

// buildControlVersion builds the control binary (with failpoints, like
// bins.control) reporting version v, once per test run.
func buildControlVersion(t *testing.T, v string) string {
	t.Helper()
	controlVersions.mu.Lock()
	defer controlVersions.mu.Unlock()
	if out, ok := controlVersions.built[v]; ok {
		return out
	}
	out := filepath.Join(bins.dir, "control-"+v)
	cmd := exec.Command("go", "build", "-tags", "failpoints", "-ldflags", "-X github.com/edgeplane/edgeplane/internal/version.Version="+v, "-o", out, "../control")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building control %s: %v\n%s", v, err, b)
	}
	if controlVersions.built == nil {
		controlVersions.built = map[string]string{}
	}
	controlVersions.built[v] = out
	return out
}

// supervised runs a command as systemd's Restart=always would: started
// again a second after it exits, until the test ends. Its output, across
// restarts, is kept.
type supervised struct {
	outputLog
	name string
	// runMu guards cmd and runs.
	runMu sync.Mutex
	cmd   *exec.Cmd
	runs  int
	stop  chan struct{}
	done  chan struct{}
}

func supervise(t *testing.T, name string, env []string, bin string, args ...string) *supervised {
	t.Helper()
	p := &supervised{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), env...)
			cmd.Stdout, cmd.Stderr = p, p
			if err := cmd.Start(); err != nil {
				fmt.Fprintf(p, "supervisor: starting %s: %v\n", bin, err)
				return
			}
			p.runMu.Lock()
			p.cmd, p.runs = cmd, p.runs+1
			p.runMu.Unlock()
			err := cmd.Wait()
			fmt.Fprintf(p, "supervisor: %s exited: %v\n", name, err)
			select {
			case <-p.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() {
		close(p.stop)
		p.runMu.Lock()
		cmd := p.cmd
		p.runMu.Unlock()
		if cmd != nil && cmd.Process != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not stop within 15 s of SIGTERM", name)
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.output())
		}
	})
	return p
}

func (p *supervised) waitOutput(t *testing.T, re string, timeout time.Duration) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for !rx.MatchString(p.output()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %s:\n%s", p.name, re, timeout, p.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *supervised) pids() int {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	return p.runs
}

// joinAgent joins machine id as the package's first start does: the
// installed binary bin, --join-only. Before its meshd registers, so that
// the agent is admitted at 127.0.0.1 (a netstack mesh IP is out of the
// gateways' reach).
func (c *cluster) joinAgent(bin, id string) {
	t := c.t
	t.Helper()
	join := exec.Command(bin, "agent", "--data", c.agentDir(id), "--join", c.invite(), "--join-only", "--machine", id)
	join.Env = append(os.Environ(), c.natsEnv(storagenode.RoleAgent, id)...)
	if out, err := join.CombinedOutput(); err != nil || !strings.Contains(string(out), "joined") {
		t.Fatalf("join %s: %v\n%s", id, err, out)
	}
}

// superviseAgent runs the agent of machine id (joined by joinAgent) as
// its unit runs it, heartbeating every second, with env and args added.
func (c *cluster) superviseAgent(bin, id string, env []string, args ...string) *supervised {
	c.t.Helper()
	args = append([]string{"agent", "--data", c.agentDir(id), "--heartbeat", "1s", "--stop-grace", "2s"}, args...)
	return supervise(c.t, "agent "+id, append(c.natsEnv(storagenode.RoleAgent, id), env...), bin, args...)
}

// startSupervisedGateway runs gateway name as the package runs it:
// `caddy supervise`, following the link in releases that the agent
// started with --gateway-releases releases --gateway-pidfile pidfile
// swaps; with gateway credentials when the store requires them.
func (c *cluster) startSupervisedGateway(name, releases, pidfile string) *gateway {
	g, config, env := c.gatewayConfig(name, map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	if c.creds != "" {
		c.gatewayCreds(config, name)
	}
	g.proc = start(c.t, "caddy supervise "+name, env, bins.caddy, "supervise", "--config", config,
		"--binary", filepath.Join(releases, "current"), "--pidfile", pidfile, "--drain", "1s")
	g.waitConnected(c.t, name)
	return g
}

// fleetVersions reads `control fleet versions -o json` as machine →
// listing.
func (c *cluster) fleetVersions() map[string]machines.Listed {
	c.t.Helper()
	var groups []struct {
		Release  string            `json:"release"`
		Machines []machines.Listed `json:"machines"`
	}
	out := c.mustControl("fleet", "versions", "-o", "json")
	if err := json.Unmarshal([]byte(out), &groups); err != nil {
		c.t.Fatalf("fleet versions: %v\n%s", err, out)
	}
	by := map[string]machines.Listed{}
	for _, g := range groups {
		for _, m := range g.Machines {
			by[m.ID] = m
		}
	}
	return by
}

const upgradeApp = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: @N@
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`

// A fleet of real agents, started as systemd would start them (the
// installed binary, restarted when it exits), moves from 1.0.0 to 1.1.0:
// the canary first, then batches, the instances serving through the
// gateway under load all along. Then a release whose agent exits at start,
// and one that stops answering RPCs: each canary rolls itself back and the
// rollout stops, the rest of the fleet untouched. Downgrades and releases
// not signed under the trust root are refused by the agents themselves.
func TestFleetUpgradeCanaryBatchesAndRollback(t *testing.T) {
	n := 5
	if v, err := strconv.Atoi(os.Getenv("EDGEPLANE_UPGRADE_MACHINES")); err == nil && v > 0 {
		n = v
	}
	buildExtra(t)
	dir := t.TempDir()
	installed := buildControlVersion(t, "1.0.0")
	next := buildControlVersion(t, "1.1.0")
	exits := buildControlVersion(t, "1.2.0")
	hangs := buildControlVersion(t, "1.2.1")

	c := newCluster(t)
	for v, bin := range map[string]string{"1.0.0": installed, "1.1.0": next, "1.2.0": exits, "1.2.1": hangs} {
		args := []string{"release", "push", v, "--control", bin, "--notes", "test build " + v}
		if v == "1.1.0" {
			// 1.1.0 carries the gateway too: the machine that runs it
			// swaps it under load.
			args = append(args, "--caddy", bins.caddy, "--meshd", extraBins.meshd)
		}
		c.mustControl(args...)
	}

	ls := c.mustControl("release", "ls")
	for _, v := range []string{"1.0.0", "1.1.0", "1.2.0", "1.2.1"} {
		if !strings.Contains(ls, v) {
			t.Fatalf("release ls lacks %s:\n%s", v, ls)
		}
	}
	// 1.2.0's agent exits at start; 1.2.1's answers no RPC.
	env := []string{"EDGEPLANE_FAILPOINTS=agent_start@1.2.0,agent_rpc@1.2.1:pause"}
	// The gateway runs on the first machine as the package runs it:
	// `caddy supervise`, following the link its agent swaps.
	gwReleases := filepath.Join(dir, "gateway-releases")
	gwPidfile := filepath.Join(dir, "gateway.pid")
	ids, agents, meshes := c.upgradableFleet(installed, n, env, func(id string) bool { return id == "u01" },
		func(string) (string, string) { return gwReleases, gwPidfile })
	gw := c.startSupervisedGateway("gw1", gwReleases, gwPidfile)
	c.mustControl("deploy", "apply", "-f", c.manifest("app.yaml", strings.ReplaceAll(upgradeApp, "@N@", strconv.Itoa(n))), "--drain-grace", "200ms")
	before := map[string]bool{}
	for _, in := range c.instances("shop") {
		before[in.ID+"@"+in.Machine] = true
	}
	eventually(t, 20*time.Second, "every machine reporting 1.0.0", func() bool {
		v := c.fleetVersions()
		for _, id := range ids {
			if v[id].Release != "1.0.0" || v[id].Arch == "" {
				return false
			}
		}
		return true
	})

	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 8, stop)
	startUp := time.Now()
	out := c.mustControl("fleet", "upgrade", "1.1.0", "--canary", "1", "--batch", "2", "--max-unavailable", "2", "--health-bound", "30s")
	took := time.Since(startUp)
	time.Sleep(500 * time.Millisecond) // the load goes on past the last restart
	close(stop)
	wg.Wait()
	t.Logf("rolling upgrade of %d agents 1.0.0 → 1.1.0 in %s under load: %d requests, %d failed\n%s", n, took.Round(time.Millisecond), l.ok.Load(), l.failed.Load(), out)
	if l.failed.Load() != 0 || l.ok.Load() < 100 {
		t.Fatalf("upgrade under load: %d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.errs)
	}
	steps := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(steps[0], "upgrading") || !strings.Contains(steps[0], ids[0]) || !strings.Contains(steps[0], "canary") ||
		!strings.HasPrefix(steps[1], "upgraded") || !strings.Contains(steps[1], ids[0]) {
		t.Fatalf("the canary did not go first and alone:\n%s", out)
	}
	if got := strings.Count(out, "\nupgraded "); got+boolInt(strings.HasPrefix(out, "upgraded ")) != n {
		t.Fatalf("%d of %d machines upgraded:\n%s", got, n, out)
	}
	// The gateway now runs 1.1.0's caddy, staged by machine u01's agent.
	if exe, want := childBinary(t, gw.proc.cmd.Process.Pid), filepath.Join(gwReleases, "1.1.0", "caddy"); exe != want {
		t.Fatalf("the gateway runs %s, want %s\n%s", exe, want, gw.proc.output())
	}
	// meshd on u01 and u02 runs 1.1.0's binary and the two handshake
	// again.
	restarted := time.Now()
	for i, m := range meshes {
		if exe, want := mustPidExe(t, m.pidfile), filepath.Join(m.dir, "releases", "1.1.0", "meshd"); exe != want {
			t.Fatalf("meshd %s runs %s, want %s\n%s", m.id, exe, want, m.proc.output())
		}
		peer := meshes[1-i].id
		eventually(t, 30*time.Second, "meshd "+m.id+" handshaking with "+peer+" after its upgrade", func() bool {
			return m.meshNode.handshakeWith(t, peer, restarted.Add(-10*time.Second))
		})
	}
	v := c.fleetVersions()
	for _, id := range ids {
		if v[id].Release != "1.1.0" || v[id].Upgrade == nil || v[id].Upgrade.State != "confirmed" {
			t.Fatalf("machine %s after the rollout: %+v", id, v[id])
		}
		// In place: the same process (exec), the binary in the release dir.
		if agents[id].pids() != 1 {
			t.Fatalf("agent %s was started %d times: an upgrade is an exec, not an exit", id, agents[id].pids())
		}
	}
	// Instances were adopted, not replaced. Once in eleven runs one was
	// found in backoff right after the rollout (restarted in place by its
	// agent, no request failed; the cause is not known yet): the test
	// waits for it to be ready again and prints what its agent said of it.
	reported := map[string]bool{}
	eventually(t, 15*time.Second, "every instance adopted and ready after the upgrade", func() bool {
		for _, in := range c.instances("shop") {
			if !before[in.ID+"@"+in.Machine] {
				t.Fatalf("instance %s on %s is new: the upgrade replaced instead of adopting", in.ID, in.Machine)
			}
			if in.State != store.InstanceReady {
				if !reported[in.ID] {
					reported[in.ID] = true
					t.Logf("instance %s on %s is %s after the upgrade (last exit %q); its agent said:\n%s", in.ID, in.Machine, in.State, in.LastExit,
						strings.Join(lines(agents[in.Machine].output(), in.ID), "\n"))
				}
				return false
			}
		}
		return true
	})

	// Sick releases: the canary rolls back by itself within the health
	// bound (+10 s), the rollout stops, nobody else is touched.
	for _, sick := range []struct{ release, why string }{
		{"1.2.0", "ended before it passed its health gate"},
		{"1.2.1", "does not answer its RPCs"},
	} {
		const bound = 8 * time.Second
		start := time.Now()
		out, errOut, code := c.control("fleet", "upgrade", sick.release, "--canary", "1", "--health-bound", bound.String())
		back := time.Since(start)
		t.Logf("sick release %s: canary back on 1.1.0 and reported after %s (goal ≤ bound %s + 10 s)\n%s%s", sick.release, back.Round(time.Millisecond), bound, out, errOut)
		if code == 0 || !strings.Contains(errOut, "upgrade_failed") || !strings.Contains(errOut, ids[0]) || !strings.Contains(errOut, sick.why) {
			t.Fatalf("rollout of %s: exit %d\n%s%s", sick.release, code, out, errOut)
		}
		if vs := c.mustControl("fleet", "versions"); !strings.Contains(vs, "failed") || !strings.Contains(vs, "stopped at "+ids[0]) {
			t.Fatalf("fleet versions after the failed rollout of %s:\n%s", sick.release, vs)
		}
		if back > bound+10*time.Second {
			t.Fatalf("the canary took %s to roll back (bound %s)", back, bound)
		}
		v := c.fleetVersions()
		if u := v[ids[0]].Upgrade; v[ids[0]].Release != "1.1.0" || u == nil || u.State != "rolled_back" || u.To != sick.release {
			t.Fatalf("canary after %s: %+v %+v", sick.release, v[ids[0]], u)
		}
		for _, id := range ids[1:] {
			if u := v[id].Upgrade; v[id].Release != "1.1.0" || u == nil || u.To != "1.1.0" {
				t.Fatalf("machine %s was touched by the failed rollout of %s: %+v", id, sick.release, v[id])
			}
		}
	}
	if !strings.Contains(agents[ids[0]].output(), "failpoint agent_start@1.2.0: exiting") {
		t.Fatalf("1.2.0 did not exit at start:\n%s", agents[ids[0]].output())
	}

	// Refused by the agent itself: a downgrade without the operator's
	// word, and a release not signed under the trust root.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rep store.UpgradeReply
	err := c.store.Call(ctx, ids[1], store.CmdUpgrade, store.UpgradeRequest{Release: "1.0.0", Attempt: int(time.Now().UnixMilli()), HealthBound: store.Duration(10 * time.Second)}, &rep)
	if se := store.AsError(err); se == nil || se.Code != store.CodeConflict || se.Detail["reason"] != "downgrade" {
		t.Fatalf("downgrade without the flag: %v", err)
	}
	forged, _ := json.Marshal(store.ReleaseRecord{Version: 1, Release: "1.4.0", Arch: v[ids[1]].Arch, Binaries: map[string]store.ReleaseBinary{}})
	if _, err := storetest.Bucket(t, c.store, c.store.Names.ReleasesBucket()).Put(ctx, store.ReleaseKey("1.4.0", v[ids[1]].Arch), forged); err != nil {
		t.Fatal(err)
	}
	err = c.store.Call(ctx, ids[1], store.CmdUpgrade, store.UpgradeRequest{Release: "1.4.0", Attempt: int(time.Now().UnixMilli()), HealthBound: store.Duration(10 * time.Second)}, &rep)
	if se := store.AsError(err); se == nil || se.Code != store.CodeBadSignature {
		t.Fatalf("unsigned release: %v", err)
	}
	// With the operator's word, one machine goes back.
	out = c.mustControl("fleet", "upgrade", "1.0.0", "--machines", ids[1], "--allow-downgrade", "--health-bound", "30s")
	if v := c.fleetVersions(); v[ids[1]].Release != "1.0.0" || v[ids[2]].Release != "1.1.0" {
		t.Fatalf("downgrade of %s: %+v\n%s", ids[1], v[ids[1]], out)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// supervisedMesh is a meshd (netstack, on loopback) run as its unit runs
// it: restarted when it exits, with a pidfile.
type supervisedMesh struct {
	meshNode
	pidfile string
	proc    *supervised
}

func (c *cluster) startSupervisedMesh(id string) *supervisedMesh {
	t := c.t
	m := &supervisedMesh{meshNode: meshNode{id: id, dir: filepath.Join(c.dir, "mesh-"+id)}}
	m.pidfile = filepath.Join(c.dir, "meshd-"+id+".pid")
	args := []string{"join", "--token", c.invite(), "--data", m.dir, "--nats", c.url,
		"--machine", id, "--mode", "netstack", "--bind", "127.0.0.1", "--listen-port", "0"}
	if c.creds != "" {
		args = append(args, "--creds", c.issueCreds(storagenode.RoleMesh, id))
	}
	if out, err := exec.Command(extraBins.meshd, args...).CombinedOutput(); err != nil {
		t.Fatalf("meshd join %s: %v\n%s", id, err, out)
	}
	m.proc = supervise(t, "meshd "+id, nil, extraBins.meshd, "run", "--data", m.dir, "--pidfile", m.pidfile,
		"--heartbeat-interval", "1s", "--reconcile-interval", "1s")
	eventually(t, 15*time.Second, "meshd "+id+" writing its pidfile", func() bool {
		_, err := os.Stat(m.pidfile)
		return err == nil
	})
	return m
}

// agentArgs are the flags of the agent beside m that moves it in a fleet
// upgrade.
func (m *supervisedMesh) agentArgs() []string {
	return []string{"--meshd-releases", filepath.Join(m.dir, "releases"), "--meshd-pidfile", m.pidfile}
}

// mustPidExe is the binary of the process a pidfile names.
func mustPidExe(t *testing.T, pidfile string) string {
	t.Helper()
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Readlink("/proc/" + strings.TrimSpace(string(b)) + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// upgradableFleet joins machines u01..uN whose agents run bin, supervised
// as systemd would run them, with env: meshd beside u01 and u02, and a
// gateway's release dir and pidfile (gwDirs) beside each machine gw
// names, for fleet upgrades to move. It returns once every agent serves.
func (c *cluster) upgradableFleet(bin string, n int, env []string, gw func(id string) bool, gwDirs func(id string) (releases, pidfile string)) (ids []string, agents map[string]*supervised, meshes []*supervisedMesh) {
	c.t.Helper()
	agents = map[string]*supervised{}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("u%02d", i)
		ids = append(ids, id)
		c.joinAgent(bin, id)
		var args []string
		if gw(id) {
			releases, pidfile := gwDirs(id)
			args = append(args, "--gateway-releases", releases, "--gateway-pidfile", pidfile)
		}
		if i <= 2 {
			m := c.startSupervisedMesh(id)
			meshes = append(meshes, m)
			args = append(args, m.agentArgs()...)
		}
		agents[id] = c.superviseAgent(bin, id, env, args...)
	}
	for _, id := range ids {
		agents[id].waitOutput(c.t, `agent serving`, 30*time.Second)
	}
	return ids, agents, meshes
}
