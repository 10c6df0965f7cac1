package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// cliEnv is the environment of an operator's CLI that reaches every
// storage node (it moves to another while one restarts), with node s1's
// signer.
func (sc *storageCluster) cliEnv() []string {
	return []string{"EDGEPLANE_NATS=" + sc.urls(), "EDGEPLANE_NATS_CREDS=" + sc.creds,
		"EDGEPLANE_SIGNING_KEY=" + filepath.Join(sc.dir, "s1", signers.SignerFile)}
}

// openAll is open on a connection to every node: a client that outlives
// the restart of any one.
func (sc *storageCluster) openAll() *store.Store {
	sc.t.Helper()
	return sc.openURL(sc.urls(), sc.creds)
}

// urls is every node's URL, as a client that outlives the restart of
// any one is given them.
func (sc *storageCluster) urls() string {
	var urls []string
	for i := range sc.servers {
		urls = append(urls, sc.url(i+1))
	}
	return strings.Join(urls, ",")
}

// fleet is a cluster whose control plane is sc's nodes: the CLI, the
// test's store client and the boxes the shared helpers start (agents,
// gateways, meshd) reach every node, with credentials sc issues. Agents
// join at 127.0.0.1, which their invites must admit on a store other
// boxes reach.
func (sc *storageCluster) fleet() *cluster {
	t := sc.t
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, url: sc.urls(), creds: sc.creds,
		signer: filepath.Join(sc.dir, "s1", signers.SignerFile), store: sc.openAll(),
		inviteArgs: []string{"--address", "127.0.0.1"}}
	c.issue = func(role, machine string) string {
		return sc.issue(storagenode.CredsRequest{Role: role, Machine: machine})
	}
	t.Cleanup(c.killInstances)
	return c
}

// releases reads every answering node's release and latest upgrade.
func storageReleases(t *testing.T, s *store.Store) map[string]store.StorageNodeStatus {
	t.Helper()
	answers, err := store.GatherStorageStatus(context.Background(), s.NC, s.Names, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.StorageNodeStatus{}
	for _, a := range answers {
		out[a.Server] = a
	}
	return out
}

// applyRun is one apply of a deploy loop: when it started, and how it
// ended.
type applyRun struct {
	ns    string
	start time.Time
	// committed: its final commit was appended; err: what it failed with.
	committed bool
	err       error
}

// applyLedger is every apply of a deploy loop.
type applyLedger struct {
	mu   sync.Mutex
	runs []applyRun
}

// tally counts the applies that started within [from, to]: those that
// succeeded, and the failures before and after their final commit.
func (l *applyLedger) tally(from, to time.Time) (ok int, failed, afterCommit []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.runs {
		if r.start.Before(from) || r.start.After(to) {
			continue
		}
		line := fmt.Sprintf("%s %s: %v", r.start.Format("15:04:05.000"), r.ns, r.err)
		switch {
		case r.err == nil:
			ok++
		case r.committed:
			afterCommit = append(afterCommit, line)
		default:
			failed = append(failed, line)
		}
	}
	return ok, failed, afterCommit
}

// succeeded reports whether an apply succeeded yet.
func (l *applyLedger) succeeded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.runs {
		if r.err == nil {
			return true
		}
	}
	return false
}

// applyLoop applies revision after revision of namespace ns, as
// `control deploy apply` does, until stop closes.
func applyLoop(s *store.Store, ns string, l *applyLedger, stop <-chan struct{}) {
	// The CLI's lease and timeouts; no gateway to wait for, nothing to
	// drain (the simulated instances serve nothing).
	d := deploy.New(s, deploy.Options{Holder: "apply-loop", GatewayWait: time.Millisecond, DrainGrace: time.Millisecond, StopGrace: 100 * time.Millisecond})
	replicas := 2
	for v := 1; ; v++ {
		select {
		case <-stop:
			return
		default:
		}
		m := &store.Manifest{Namespace: ns, Services: map[string]store.ServiceSpec{"web": {
			Command: []string{"app"}, Replicas: &replicas, Env: map[string]string{"V": fmt.Sprint(v)},
			Readiness: store.Readiness{Path: "/healthz"}, Routes: []store.Route{{Hosts: []string{ns + ".example.com"}}},
		}}}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r := applyRun{ns: ns, start: time.Now()}
		st, err := d.Apply(ctx, m)
		cancel()
		r.err, r.committed = err, st != nil && st.CommitSeq > 0
		l.mu.Lock()
		l.runs = append(l.runs, r)
		l.mu.Unlock()
		// An operator's loop: a moment between applies, a little more
		// after a busy lease.
		pause := 50 * time.Millisecond
		if store.HasCode(err, store.CodeBusy) {
			pause = 300 * time.Millisecond
		}
		select {
		case <-stop:
			return
		case <-time.After(pause):
		}
	}
}

// nodeWatch polls the storage nodes' views as `control storage ls` reads
// them, and keeps, per node, when it was first seen gone (not answering:
// its server restarting) and when first seen back (answering on the new
// release, no replica on it lagging), and every poll that found write
// quorum lost. A replica lagging for a moment on a node that stays up
// (a stream's new leader has not heard from it yet) is counted, not
// judged.
type nodeWatch struct {
	mu         sync.Mutex
	polls      int
	quorumLost []string
	gone, back map[string]time.Time
	// maxGone is the most nodes seen gone at once; lagged counts the
	// polls that saw a replica lag on a node that answered.
	maxGone, lagged int
}

func watchNodes(s *store.Store, release string, stop <-chan struct{}) (*nodeWatch, *sync.WaitGroup) {
	w := &nodeWatch{gone: map[string]time.Time{}, back: map[string]time.Time{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			v, err := storage.Read(ctx, s, 700*time.Millisecond)
			cancel()
			if err != nil {
				continue
			}
			now := time.Now()
			w.mu.Lock()
			w.polls++
			if v.Quorum != nil {
				w.quorumLost = append(w.quorumLost, now.Format("15:04:05.000")+": "+v.Quorum.Message)
			}
			rel := map[string]string{}
			for _, a := range v.Answers {
				rel[a.Server] = a.Release
			}
			gone, lagged := 0, false
			for _, n := range v.Nodes {
				switch {
				case !n.Answered:
					gone++
					if _, seen := w.gone[n.Name]; !seen {
						w.gone[n.Name] = now
					}
				case n.Lagging > 0:
					lagged = true
				default:
					if _, seen := w.back[n.Name]; !seen && rel[n.Name] == release {
						w.back[n.Name] = now
					}
				}
			}
			w.maxGone = max(w.maxGone, gone)
			if lagged {
				w.lagged++
			}
			w.mu.Unlock()
		}
	}()
	return w, &wg
}

// orderTimes is when each storage node took its upgrade order, as its
// own log says.
func orderTimes(t *testing.T, sc *storageCluster) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for i, p := range sc.servers {
		for _, line := range strings.Split(p.output(), "\n") {
			var l struct {
				TS  float64 `json:"ts"`
				Msg string  `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "storage node upgrading") {
				out[fmt.Sprintf("s%d", i+1)] = time.Unix(0, int64(l.TS*1e9))
			}
		}
	}
	return out
}

// The three storage nodes of a cluster, running 1.0.0, move to 1.1.0 one
// at a time with `control storage upgrade` while simulated agents write
// and a deploy loop applies: no apply fails after its final commit, at
// least 95% succeed, write quorum holds at every look, each node is back
// (answering on 1.1.0, caught up) before the next goes out, the meta
// leader goes last, and every node is the same process as before (exec
// in place) running the staged binary.
func TestStorageUpgradeNodeByNodeUnderLoad(t *testing.T) {
	v1 := buildControlVersion(t, "1.0.0")
	v2 := buildControlVersion(t, "1.1.0")
	sc := newStorageClusterOf(t, v1, nil)
	env := sc.cliEnv()
	if out, errOut, code := runControl(t, env, "release", "push", "1.1.0", "--control", v2); code != 0 {
		t.Fatalf("release push: exit %d\n%s%s", code, out, errOut)
	}
	s := sc.openAll()
	for name, a := range storageReleases(t, s) {
		if a.Release != "1.0.0" {
			t.Fatalf("storage node %s runs %q before the upgrade", name, a.Release)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleet, err := fleetsim.Start(ctx, s, fleetsim.Config{Machines: 3, Prefix: "edge", Beat: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()

	stop := make(chan struct{})
	ledger := &applyLedger{}
	var loops sync.WaitGroup
	loops.Add(1)
	go func() {
		defer loops.Done()
		applyLoop(s, "shop", ledger, stop)
	}()
	watch, watched := watchNodes(s, "1.1.0", stop)
	// The load runs before the first node moves, and after the last is
	// back: the applies outside the upgrade are the baseline.
	eventually(t, 30*time.Second, "a first apply", ledger.succeeded)
	time.Sleep(3 * time.Second)
	start := time.Now()
	out, errOut, code := runControl(t, env, "storage", "upgrade", "1.1.0", "--health-bound", "90s")
	took := time.Since(start)
	end := time.Now()
	time.Sleep(3 * time.Second)
	close(stop)
	loops.Wait()
	watched.Wait()
	t.Logf("storage upgrade 1.0.0 → 1.1.0 of 3 nodes in %s under load:\n%s", took.Round(time.Millisecond), out)
	if code != 0 {
		t.Fatalf("storage upgrade: exit %d\n%s%s", code, out, errOut)
	}

	ok, failed, afterCommit := ledger.tally(start, end)
	total := ok + len(failed) + len(afterCommit)
	t.Logf("applies started during the upgrade: %d, %d succeeded, %d failed before their final commit, %d after it; failures: %v",
		total, ok, len(failed), len(afterCommit), failed)
	bok, bfailed, bafter := ledger.tally(time.Time{}, time.Now())
	t.Logf("applies over the whole run (3 s before and after the upgrade too): %d, %d succeeded; failures: %v %v",
		bok+len(bfailed)+len(bafter), bok, bfailed, bafter)
	if len(afterCommit) > 0 {
		t.Errorf("applies failed after their final commit: %v", afterCommit)
	}
	if total < 10 || float64(ok) < 0.95*float64(total) {
		t.Errorf("%d of %d applies succeeded during the upgrade, want at least 95%%", ok, total)
	}
	watch.mu.Lock()
	t.Logf("storage views polled %d times (%d saw a replica lag on a node that answered); at most %d node(s) gone at once; gone: %v; back: %v",
		watch.polls, watch.lagged, watch.maxGone, watch.gone, watch.back)
	if len(watch.quorumLost) > 0 {
		t.Errorf("write quorum lost during the upgrade: %v", watch.quorumLost)
	}
	if watch.maxGone > 1 {
		t.Errorf("%d nodes were gone at once", watch.maxGone)
	}
	// Each node took its order (its own log's time) only once the node
	// before it was seen back: on the new release, caught up.
	ordered := orderTimes(t, sc)
	var order []string
	for n := range ordered {
		order = append(order, n)
	}
	sort.Slice(order, func(i, j int) bool { return ordered[order[i]].Before(ordered[order[j]]) })
	if len(order) != 3 {
		t.Errorf("%d nodes took an upgrade order, want 3: %v", len(order), ordered)
	}
	for i, n := range order {
		back, ok := watch.back[n]
		if !ok {
			t.Errorf("storage node %s was never seen back on 1.1.0 and current", n)
			continue
		}
		t.Logf("storage node %s: ordered at %s, seen back and current at %s (%s)", n, ordered[n].Format("15:04:05.000"), back.Format("15:04:05.000"), back.Sub(ordered[n]).Round(time.Millisecond))
		if i+1 < len(order) && !back.Before(ordered[order[i+1]]) {
			t.Errorf("storage node %s took its order at %s, before %s was seen back (%s)", order[i+1], ordered[order[i+1]].Format("15:04:05.000"), n, back.Format("15:04:05.000"))
		}
	}
	watch.mu.Unlock()

	// Progress: one line per node with its time, the meta leader last.
	var upgraded []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "upgraded ") {
			upgraded = append(upgraded, line)
		}
	}
	if len(upgraded) != 3 || !regexp.MustCompile(` in [0-9.]+m?s`).MatchString(upgraded[0]) {
		t.Fatalf("want three upgraded lines with their times:\n%s", out)
	}
	for i, line := range upgraded {
		if leader := strings.Contains(line, "(meta leader)"); leader != (i == 2) {
			t.Fatalf("the meta leader did not go last:\n%s", out)
		}
	}
	for name, a := range storageReleases(t, s) {
		if a.Release != "1.1.0" || a.Upgrade == nil || a.Upgrade.State != "confirmed" {
			t.Fatalf("storage node %s after the upgrade: release %q, upgrade %+v", name, a.Release, a.Upgrade)
		}
	}
	// In place: each node is the process it was (exec keeps the PID),
	// running the binary staged in its data dir.
	for i, p := range sc.servers {
		select {
		case <-p.done:
			t.Fatalf("storage node s%d's process ended: %v\n%s", i+1, p.err, p.output())
		default:
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.cmd.Process.Pid))
		if want := filepath.Join(sc.dir, fmt.Sprintf("s%d", i+1), "releases", "1.1.0", "control"); err != nil || exe != want {
			t.Fatalf("storage node s%d runs %s (%v), want %s", i+1, exe, err, want)
		}
	}
}

// A release whose storage node never passes its health gate (failpoint
// storage_gate@1.2.0) is put back: the first node rolls itself back onto
// 1.0.0 within the bound, the upgrade stops there with upgrade_failed
// naming the node and why, and no other node is touched. Before it, the
// order's subject is out of reach of agent and gateway credentials, and
// control credentials without a signing key are refused.
func TestStorageUpgradeSickReleaseRollsBack(t *testing.T) {
	v1 := buildControlVersion(t, "1.0.0")
	sick := buildControlVersion(t, "1.2.0")
	sc := newStorageClusterOf(t, v1, []string{"EDGEPLANE_FAILPOINTS=storage_gate@1.2.0:pause"})
	env := sc.cliEnv()
	if out, errOut, code := runControl(t, env, "release", "push", "1.2.0", "--control", sick); code != 0 {
		t.Fatalf("release push: exit %d\n%s%s", code, out, errOut)
	}
	s := sc.openAll()
	attackStorageUpgradeOrders(t, sc, s)

	view, err := storage.Read(context.Background(), s, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := ""
	for _, n := range view.Nodes {
		if !n.MetaLeader {
			first = n.Name
			break
		}
	}
	const bound = 15 * time.Second
	start := time.Now()
	out, errOut, code := runControl(t, env, "storage", "upgrade", "1.2.0", "--health-bound", bound.String())
	back := time.Since(start)
	t.Logf("sick release 1.2.0: upgrade stopped after %s (health bound %s)\n%s%s", back.Round(time.Millisecond), bound, out, errOut)
	if code == 0 || !strings.Contains(errOut, store.CodeUpgradeFailed) || !strings.Contains(errOut, "storage node "+first) ||
		!strings.Contains(errOut, "rolled back (back on 1.0.0 and current)") || !strings.Contains(errOut, "storage_gate@1.2.0") {
		t.Fatalf("storage upgrade of a sick release: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Count(out, "upgrading ") != 1 {
		t.Fatalf("the upgrade went past the first node:\n%s", out)
	}
	for name, a := range storageReleases(t, s) {
		switch {
		case a.Release != "1.0.0":
			t.Fatalf("storage node %s runs %s after the failed upgrade", name, a.Release)
		case name == first && (a.Upgrade == nil || a.Upgrade.State != "rolled_back" || a.Upgrade.To != "1.2.0"):
			t.Fatalf("storage node %s after its rollback: %+v", name, a.Upgrade)
		case name != first && a.Upgrade != nil:
			t.Fatalf("storage node %s was touched: %+v", name, a.Upgrade)
		}
	}
	i := int(first[1] - '0')
	p := sc.servers[i-1]
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.cmd.Process.Pid)); err != nil || exe != v1 {
		t.Fatalf("storage node %s runs %s (%v) after its rollback, want %s\n%s", first, exe, err, v1, p.output())
	}
	after, err := storage.Read(context.Background(), s, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if problem := storage.Healthy(after); problem != "" {
		t.Fatalf("the cluster after the rollback: %s", problem)
	}
}

// Who may order a storage node to upgrade: only control credentials, and
// with them only an order signed by a certified signer. Agent and gateway
// credentials (real ones, issued by the cluster) cannot reach the
// subject at all: no answer comes, and the node is untouched. Control
// credentials without a signing key send the order unsigned, as a thief
// must: the node refuses it (order_refused, unsigned).
func attackStorageUpgradeOrders(t *testing.T, sc *storageCluster, s *store.Store) {
	t.Helper()
	req := store.UpgradeRequest{Release: "1.2.0", Attempt: int(time.Now().UnixMilli()), HealthBound: store.Duration(10 * time.Second)}
	data, _ := json.Marshal(req)
	subject := sc.names.StorageNodeSubject("s2", store.CmdStorageUpgrade)
	for _, who := range []storagenode.CredsRequest{
		{Role: storagenode.RoleAgent, Machine: "m1"},
		{Role: storagenode.RoleGateway, Machine: "gw1"},
	} {
		creds := sc.issue(who)
		nc, err := store.Connect(store.ConnectOptions{URL: sc.url(2), CredsFile: creds, Name: "thief-" + who.Role})
		if err != nil {
			t.Fatal(err)
		}
		msg, err := nc.Request(subject, data, 2*time.Second)
		nc.Close()
		if err == nil {
			t.Fatalf("%s credentials reached storage node s2's upgrade order: answered %s", who.Role, msg.Data)
		}
		t.Logf("%s credentials: the order's subject is out of reach: %v", who.Role, err)
	}
	thief := sc.issue(storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "stolen"})
	nc, err := store.Connect(store.ConnectOptions{URL: sc.url(2), CredsFile: thief, Name: "thief-control"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = store.Call(ctx, nc, subject, "s2", store.CmdStorageUpgrade, req, nil)
	if !store.HasCode(err, store.CodeOrderRefused) || store.AsError(err).Detail["reason"] != signing.ReasonUnsigned {
		t.Fatalf("control credentials without a signing key: want order_refused (unsigned), got %v", err)
	}
	if a := storageReleases(t, s)["s2"]; a.Release != "1.0.0" || a.Upgrade != nil {
		t.Fatalf("storage node s2 after the attacks: release %s, upgrade %+v", a.Release, a.Upgrade)
	}
}
