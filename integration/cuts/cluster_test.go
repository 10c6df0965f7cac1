package cuts_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/internal/powercut"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Three storage nodes, each in its own process (this test binary run
// again, see TestMain) with its data directory on its own powercut mount
// served by the test: a node can be cut (its mount cut, its process
// killed) or paused (SIGSTOP: a node that stops answering and comes back
// with what it held, as a VM paused or a process stalled).

// nodeSpec is what a storage node process is started with.
type nodeSpec struct {
	Name, DataDir, Listen, Route string
	Routes                       []string
}

// nodeEnv carries a nodeSpec to the process TestMain turns into a
// storage node.
const nodeEnv = "CUTS_STORAGE_NODE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(nodeEnv); spec != "" {
		os.Exit(runNode(spec))
	}
	os.Exit(m.Run())
}

// runNode runs one storage node of the cluster until it is killed.
func runNode(spec string) int {
	var n nodeSpec
	if err := json.Unmarshal([]byte(spec), &n); err != nil {
		fmt.Println("ERR", err)
		return 2
	}
	// Warnings and errors go to stderr, which the test keeps per node.
	logger, _ := zap.NewDevelopment(zap.IncreaseLevel(zapcore.WarnLevel), zap.AddStacktrace(zapcore.FatalLevel))
	ns, err := storagenode.Start(storagenode.Config{DataDir: n.DataDir, Listen: n.Listen, ServerName: n.Name, Logger: logger,
		Cluster: &storagenode.ClusterConfig{Name: "cuts", Listen: n.Route, Routes: n.Routes}})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("READY")
	ns.WaitForShutdown()
	return 0
}

// node is one storage node of a cluster: its disk, its process.
type node struct {
	spec    nodeSpec
	backing string
	fs      *powercut.FS
	cmd     *exec.Cmd
	paused  bool
}

// cluster is three storage nodes on loopback.
type cluster struct {
	t      *testing.T
	nodes  []*node
	ctlDir string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	if err := powercut.Available(); err != nil {
		t.Skipf("skipped: %v", err)
	}
	dir := t.TempDir()
	c := &cluster{t: t, ctlDir: filepath.Join(dir, "control")}
	if err := os.Mkdir(c.ctlDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var routes []string
	for i := range 3 {
		n := &node{spec: nodeSpec{Name: fmt.Sprintf("s%d", i+1), DataDir: filepath.Join(dir, fmt.Sprintf("mnt%d", i+1)),
			Listen: storetest.FreeAddr(t), Route: storetest.FreeAddr(t)}, backing: filepath.Join(dir, fmt.Sprintf("disk%d", i+1))}
		routes = append(routes, n.spec.Route)
		for _, d := range []string{n.backing, n.spec.DataDir} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		n.spec.Routes = routes
	}
	for i := range c.nodes {
		c.boot(i)
	}
	t.Cleanup(c.halt)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range c.nodes {
			b, _ := os.ReadFile(n.backing + ".log")
			t.Logf("storage node %s's log (tail):\n%s", n.spec.Name, b[max(0, len(b)-4000):])
		}
	})
	return c
}

// urls are the client URLs of every node.
func (c *cluster) urls() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, "nats://"+n.spec.Listen)
	}
	return strings.Join(u, ",")
}

// boot mounts node i's disk and starts its process.
func (c *cluster) boot(i int) {
	c.t.Helper()
	n := c.nodes[i]
	var err error
	if n.fs, err = powercut.Mount(n.backing, n.spec.DataDir); err != nil {
		c.t.Fatal(err)
	}
	spec, _ := json.Marshal(n.spec)
	n.cmd = exec.Command(os.Args[0], "-test.run=^$")
	n.cmd.Env = append(os.Environ(), nodeEnv+"="+string(spec))
	logf, err := os.OpenFile(n.backing+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- boot at %s\n", time.Now().Format("15:04:05.000"))
	n.cmd.Stderr = logf
	out, err := n.cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := n.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case ready <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-ready:
		if line != "READY" {
			c.t.Fatalf("storage node %s: %s", n.spec.Name, line)
		}
	case <-time.After(time.Minute):
		c.t.Fatalf("storage node %s did not start in a minute", n.spec.Name)
	}
}

// cut cuts node i's power: its disk forgets what was not synced and its
// process dies. Under the fence the caller holds.
func (c *cluster) cutDisk(i int) {
	if err := c.nodes[i].fs.Cut(); err != nil {
		c.t.Errorf("cutting %s: %v", c.nodes[i].spec.Name, err)
	}
}

// kill ends node i's process, after its disk was cut.
func (c *cluster) kill(i int) {
	n := c.nodes[i]
	n.cmd.Process.Kill()
	n.cmd.Wait()
	<-n.fs.Done()
}

// pause stops node i's process (SIGSTOP), resume lets it go on.
func (c *cluster) pause(i int) {
	c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
	c.nodes[i].paused = true
}

func (c *cluster) resume(i int) {
	c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
	c.nodes[i].paused = false
}

// halt stops every node at the end of the test: a clean shutdown.
func (c *cluster) halt() {
	for _, n := range c.nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			n.cmd.Process.Signal(syscall.SIGCONT)
			n.cmd.Process.Kill()
			n.cmd.Wait()
		}
		if n.fs != nil {
			n.fs.Unmount()
		}
	}
}

// cutMode is how power goes in a cluster.
type cutMode int

const (
	// allAtOnce: every node's power at the same instant (one circuit).
	allAtOnce cutMode = iota
	// oneWhileOnePaused: one node is paused at a random point, another's
	// power is cut later; the cut node reboots after the paused one
	// resumes.
	oneWhileOnePaused
)

// cutPower runs sc on the cluster under mode, sc.cuts times.
func (c *cluster) cutPower(t *testing.T, sc scenario, mode cutMode) {
	sd := seed(t)
	t.Logf("seed %d (CUTS_SEED=%d repeats this run)", sd, sd)
	rng := rand.New(rand.NewPCG(sd, 0))
	start := time.Now()
	s := connect(t, c.urls(), c.ctlDir, "box", 3)
	var took timings
	for i := range sc.cuts {
		name := fmt.Sprintf("cut %d of %d (seed %d)", i+1, sc.cuts, sd)
		var cut, paused []int
		var before func()
		switch mode {
		case allAtOnce:
			cut = []int{0, 1, 2}
		case oneWhileOnePaused:
			p := rng.Perm(3)
			cut, paused = p[:1], p[1:2]
			before = func() { c.pause(paused[0]) }
			name += fmt.Sprintf(": %s cut while %s paused", c.nodes[cut[0]].spec.Name, c.nodes[paused[0]].spec.Name)
		}
		last := runCutAround(t, sc, rng, before, func() {
			for _, n := range cut {
				c.cutDisk(n)
			}
		}, func() {
			for _, n := range cut {
				c.kill(n)
			}
		}, &s, func() *store.Store {
			for _, n := range paused {
				c.resume(n)
			}
			for _, n := range cut {
				c.boot(n)
			}
			return connect(t, c.urls(), c.ctlDir, "box", 3)
		}, name)
		took.add(last)
		if t.Failed() {
			return
		}
		if testing.Verbose() {
			t.Logf("%s: done at %s (%s)", name, time.Since(start).Round(time.Millisecond), last)
		}
	}
	t.Logf("%d cuts in %s: %s", sc.cuts, time.Since(start).Round(time.Millisecond), took)
}

// Deploys, machine admissions and removals at once on three storage
// nodes whose power goes at the same instant: what every node had synced
// is all there is, and it holds every commit reported and every machine
// admitted or removed.
func TestCutsClusterAllAtOnce(t *testing.T) {
	c := newCluster(t)
	c.cutPower(t, bothScenarios(t, c), allAtOnce)
}

// The same with one node cut while another is paused: the paused node
// resumes, then the cut one reboots.
func TestCutsClusterOneWhileOnePaused(t *testing.T) {
	c := newCluster(t)
	c.cutPower(t, bothScenarios(t, c), oneWhileOnePaused)
}

// bothScenarios runs the deploy and the machine admission and removal
// scenarios side by side, so that one cut of a cluster (slow to reboot)
// serves them all.
func bothScenarios(t *testing.T, c *cluster) scenario {
	startFleet(t, connect(t, c.urls(), c.ctlDir, "fleet", 3))
	d := &deployLedger{committed: map[string]int64{}, promoted: map[string]bool{}}
	m := newMachineLedger(t)
	t.Cleanup(func() {
		t.Logf("%d deploys reported committed, %d machines admitted and removed; %d applies failed with the power on (last: %v)",
			len(d.committed), len(m.removed), d.failed, d.lastErr)
	})
	// Each machine admitted is removed at once: an admitted machine runs
	// no agent here, and deploys would try to place on it.
	deploys, admissions := d.work(0), m.work(true)
	return scenario{cuts: clusterCuts(t), window: 3 * time.Second,
		work: func(ctx context.Context, s *store.Store, rng *rand.Rand, ack func(func())) {
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); admissions(ctx, s, rng, ack) }()
			deploys(ctx, s, rng, ack)
			wg.Wait()
		},
		check: func(ctx context.Context, t *testing.T, s *store.Store, cut string) {
			d.check(ctx, t, s, cut)
			m.check(ctx, t, s, cut)
		}}
}

// clusterCuts is how many cuts a cluster test makes: CUTS_CLUSTER, or 4.
// A cluster's reboot is slow (every RAFT group elects its leader again,
// 8 to 30 s on a busy box against about 0.4 s for a single box), so the
// suite runs a few and a longer run is asked for (CUTS_CLUSTER=20).
func clusterCuts(t *testing.T) int {
	if v := os.Getenv("CUTS_CLUSTER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CUTS_CLUSTER=%q: want a number of cuts", v)
		}
		return n
	}
	return 4
}
