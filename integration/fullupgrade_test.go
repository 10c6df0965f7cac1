package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// loadPhases notes, at the end of each phase of a run, how many requests
// the load through each gateway had sent so far, so that each phase's
// figures can be told apart.
type loadPhases struct {
	load  *skewLoad
	last  []int64
	lines []string
}

func (p *loadPhases) mark(phase string, took time.Duration) {
	if p.last == nil {
		p.last = make([]int64, 2*len(p.load.loads))
	}
	var parts []string
	for i, l := range p.load.loads {
		ok, failed := l.ok.Load(), l.failed.Load()
		parts = append(parts, fmt.Sprintf("gateway %d: %d requests, %d failed", i+1, ok+failed-p.last[2*i]-p.last[2*i+1], failed-p.last[2*i+1]))
		p.last[2*i], p.last[2*i+1] = ok, failed
	}
	p.lines = append(p.lines, fmt.Sprintf("%s (%s): %s", phase, took.Round(time.Millisecond), strings.Join(parts, "; ")))
}

// The first goal of issue 39, measured: a whole fleet moves from release
// 1.0.0 to 1.1.0 as an operator moves it, under a steady load through
// both gateways, and no request fails. Three storage nodes (each in its
// own network namespace), five machines whose agents run as their unit
// runs them, two gateways (each beside an agent that swaps its binary)
// and meshd on two machines, all on 1.0.0; an app with a replica on each
// machine. Then `release push`, `storage upgrade` (node by node, meta
// leader last), `fleet upgrade` (canary, then batches: agents, gateways,
// meshd) and a deploy on the new release. At the end every storage node,
// agent, gateway and meshd runs 1.1.0. The per-node storage upgrade
// times, the fleet upgrade's time and the request counts are the
// figures README "Versions and upgrades" reports.
func TestFullFleetUpgradeUnderLoad(t *testing.T) {
	const n = 5
	buildExtra(t)
	a := buildControlVersion(t, "1.0.0")
	b := buildControlVersion(t, "1.1.0")
	sc := newStorageClusterOf(t, a, nil)
	c := sc.fleet()

	// Gateways beside the first and the last machine (the canary's and
	// the last batch's), meshd beside the first two.
	gwOn := map[string]bool{"u01": true, fmt.Sprintf("u%02d", n): true}
	gwDirs := func(id string) (string, string) {
		return filepath.Join(c.dir, "gw-releases-"+id), filepath.Join(c.dir, "gw-"+id+".pid")
	}
	ids, agents, meshes := c.upgradableFleet(a, n, nil, func(id string) bool { return gwOn[id] }, gwDirs)
	var gws []*gateway
	var gwIDs []string
	for _, id := range ids {
		if gwOn[id] {
			releases, pidfile := gwDirs(id)
			gws = append(gws, c.startSupervisedGateway("gw-"+id, releases, pidfile))
			gwIDs = append(gwIDs, id)
		}
	}
	c.mustControl("deploy", "apply", "-f", c.manifest("app.yaml", strings.ReplaceAll(upgradeApp, "@N@", strconv.Itoa(n))), "--drain-grace", "200ms")
	first := allRouted(t, c, n, gws...)
	spread := map[string]bool{}
	for _, in := range c.instances("shop") {
		spread[in.Machine] = true
	}
	if len(spread) != n {
		t.Fatalf("shop's %d replicas are on %d machines, want one on each", n, len(spread))
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

	load := startSkewLoad(gws...)
	phases := &loadPhases{load: load}
	mark := time.Now()
	time.Sleep(2 * time.Second) // a baseline before anything moves
	phases.mark("before the upgrade", time.Since(mark))

	mark = time.Now()
	c.mustControl("release", "push", "1.1.0", "--control", b, "--caddy", bins.caddy, "--meshd", extraBins.meshd, "--notes", "test build 1.1.0")
	phases.mark("release push 1.1.0", time.Since(mark))

	mark = time.Now()
	storageOut := c.mustControl("storage", "upgrade", "1.1.0", "--health-bound", "90s")
	storageTook := time.Since(mark)
	phases.mark("storage upgrade of 3 nodes", storageTook)

	mark = time.Now()
	fleetOut := c.mustControl("fleet", "upgrade", "1.1.0", "--canary", "1", "--batch", "2", "--max-unavailable", "2", "--health-bound", "30s")
	fleetTook := time.Since(mark)
	phases.mark(fmt.Sprintf("fleet upgrade of %d machines", n), fleetTook)
	// The upgrades moved processes, not the app: the instances the first
	// deploy started are the ones live now.
	if _, ids := liveIDs(t, c, "shop"); !slices.Equal(ids, first) {
		t.Errorf("shop's live instances changed through the upgrades: %v, then %v", first, ids)
	}

	mark = time.Now()
	c.mustControl("deploy", "apply", "-f", c.manifest("app2.yaml", strings.Replace(strings.ReplaceAll(upgradeApp, "@N@", strconv.Itoa(n)),
		"    replicas:", "    env: {V: \"2\"}\n    replicas:", 1)), "--drain-grace", "200ms")
	live := allRouted(t, c, n, gws...)
	for _, id := range live {
		if slices.Contains(first, id) {
			t.Errorf("instance %s of the first revision is still live after the deploy on 1.1.0: %v", id, live)
		}
	}
	phases.mark("deploy on 1.1.0", time.Since(mark))

	mark = time.Now()
	time.Sleep(time.Second) // the load goes on past the last change
	phases.mark("after", time.Since(mark))
	total := load.end(t)

	var nodeTimes []string
	for _, line := range strings.Split(storageOut, "\n") {
		if strings.HasPrefix(line, "upgraded ") {
			nodeTimes = append(nodeTimes, line)
		}
	}
	t.Logf("full fleet upgrade 1.0.0 → 1.1.0 (3 storage nodes, %d machines, 2 gateways, 2 meshd) under load through both gateways: %s\n"+
		"storage upgrade in %s, per node:\n  %s\nfleet upgrade in %s:\n%s\nrequests by phase:\n  %s",
		n, total, storageTook.Round(time.Millisecond), strings.Join(nodeTimes, "\n  "), fleetTook.Round(time.Millisecond), fleetOut,
		strings.Join(phases.lines, "\n  "))
	if len(nodeTimes) != 3 || !strings.Contains(nodeTimes[2], "(meta leader)") {
		t.Errorf("want three storage nodes upgraded, the meta leader last:\n%s", storageOut)
	}

	// Every process on 1.1.0: the storage nodes, the agents (as `fleet
	// versions` lists them), the gateways and meshd (the binaries their
	// agents staged).
	for name, st := range storageReleases(t, c.store) {
		if st.Release != "1.1.0" || st.Upgrade == nil || st.Upgrade.State != "confirmed" {
			t.Errorf("storage node %s after the upgrade: release %q, upgrade %+v", name, st.Release, st.Upgrade)
		}
	}
	v := c.fleetVersions()
	for _, id := range ids {
		if v[id].Release != "1.1.0" || v[id].Upgrade == nil || v[id].Upgrade.State != "confirmed" {
			t.Errorf("machine %s after the upgrade: release %q, upgrade %+v", id, v[id].Release, v[id].Upgrade)
		}
		if agents[id].pids() != 1 {
			t.Errorf("agent %s was started %d times: an upgrade is an exec, not an exit", id, agents[id].pids())
		}
	}
	for i, g := range gws {
		if exe, want := childBinary(t, g.proc.cmd.Process.Pid), filepath.Join(c.dir, "gw-releases-"+gwIDs[i], "1.1.0", "caddy"); exe != want {
			t.Errorf("gateway beside %s runs %s, want %s", gwIDs[i], exe, want)
		}
	}
	// The two meshd on 1.1.0 handshake with each other: after the later
	// one started (each writes its pidfile as it starts). Not within a
	// window before now: the deploy ran since, and WireGuard handshakes
	// again only every two minutes.
	var restarted time.Time
	for _, m := range meshes {
		if exe, want := mustPidExe(t, m.pidfile), filepath.Join(m.dir, "releases", "1.1.0", "meshd"); exe != want {
			t.Errorf("meshd %s runs %s, want %s", m.id, exe, want)
		}
		fi, err := os.Stat(m.pidfile)
		if err != nil {
			t.Fatal(err)
		}
		if fi.ModTime().After(restarted) {
			restarted = fi.ModTime()
		}
	}
	for i, m := range meshes {
		peer := meshes[1-i].id
		eventually(t, 30*time.Second, "meshd "+m.id+" handshaking with "+peer+" on 1.1.0", func() bool {
			return m.meshNode.handshakeWith(t, peer, restarted)
		})
	}
	t.Logf("after the deploy on 1.1.0, shop is served by %v", live)
}
