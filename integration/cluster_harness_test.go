package integration

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// extraBins are binaries only some tests need, built on first use.
var extraBins struct {
	once      sync.Once
	err       error
	caddy     string
	dns       string
	meshd     string
	buildTime time.Duration
}

func buildExtra(t *testing.T) {
	t.Helper()
	extraBins.once.Do(func() {
		start := time.Now()
		extraBins.caddy = filepath.Join(bins.dir, "caddy")
		extraBins.dns = filepath.Join(bins.dir, "edgeplane-dns")
		extraBins.meshd = filepath.Join(bins.dir, "meshd")
		for _, b := range []struct{ out, pkg string }{
			{extraBins.caddy, "../caddymodule/cmd/caddy"},
			{extraBins.dns, "../dnsproj/cmd/edgeplane-dns"},
			{extraBins.meshd, "../meshd"},
		} {
			cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				extraBins.err = fmt.Errorf("building %s: %v\n%s", b.pkg, err, out.String())
				return
			}
		}
		extraBins.buildTime = time.Since(start)
	})
	if extraBins.err != nil {
		t.Fatal(extraBins.err)
	}
}

// freeAddr returns a free 127.0.0.1 TCP address (UDP on the same port is
// free in practice on a test box).
func freeAddr(t *testing.T) string {
	t.Helper()
	return storetest.FreeAddr(t)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// netLab is a set of network namespaces on one bridge: each storage node
// gets its own namespace and address, the test (in the root namespace)
// reaches all of them, and partitions are prohibit routes between
// namespaces, removed to heal. Everything is torn down when the test ends.
type netLab struct {
	t      *testing.T
	id     string
	bridge string
	subnet string // "10.213.N"
	ns     []string
}

func newNetLab(t *testing.T, n int) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the ip command (iproute2) is not installed")
	}
	var raw [3]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	lab := &netLab{t: t, id: id, bridge: "epbr" + id, subnet: fmt.Sprintf("10.213.%d", int(raw[0])%250+1)}
	t.Cleanup(lab.teardown)
	run(t, "ip", "link", "add", lab.bridge, "type", "bridge")
	run(t, "ip", "addr", "add", lab.subnet+".254/24", "dev", lab.bridge)
	run(t, "ip", "link", "set", lab.bridge, "up")
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("ep%s-%d", id, i)
		host := fmt.Sprintf("epv%s%d", id, i)
		run(t, "ip", "netns", "add", ns)
		lab.ns = append(lab.ns, ns)
		run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "link", "set", host, "master", lab.bridge)
		run(t, "ip", "link", "set", host, "up")
		run(t, "ip", "-n", ns, "addr", "add", lab.addr(i)+"/24", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	return lab
}

// addr is node i's (1-based) address.
func (l *netLab) addr(i int) string { return fmt.Sprintf("%s.%d", l.subnet, i) }

// cut makes node i unreachable from (and unable to reach) every other
// node; the root namespace still reaches it. heal undoes it.
func (l *netLab) cut(i int) {
	for j := 1; j <= len(l.ns); j++ {
		if j == i {
			continue
		}
		run(l.t, "ip", "-n", l.ns[i-1], "route", "add", "prohibit", l.addr(j)+"/32")
		run(l.t, "ip", "-n", l.ns[j-1], "route", "add", "prohibit", l.addr(i)+"/32")
	}
}

func (l *netLab) heal(i int) {
	for j := 1; j <= len(l.ns); j++ {
		if j == i {
			continue
		}
		run(l.t, "ip", "-n", l.ns[i-1], "route", "del", "prohibit", l.addr(j)+"/32")
		run(l.t, "ip", "-n", l.ns[j-1], "route", "del", "prohibit", l.addr(i)+"/32")
	}
}

func (l *netLab) teardown() {
	for _, ns := range l.ns {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
	_ = exec.Command("ip", "link", "del", l.bridge).Run()
}

// storageCluster is three `control server` storage nodes, each in its own
// namespace, with credentials required (their listeners are not loopback).
type storageCluster struct {
	t       *testing.T
	lab     *netLab
	dir     string
	auth    *storagenode.Auth
	creds   string // control role
	servers []*proc
	names   store.Names
	// bin is the control binary the nodes run (default bins.control),
	// with env added to their environment.
	bin string
	env []string
}

func newStorageCluster(t *testing.T) *storageCluster {
	t.Helper()
	return newStorageClusterOf(t, "", nil)
}

// newStorageClusterOf is newStorageCluster with the nodes running bin
// (default bins.control), env added to their environment.
func newStorageClusterOf(t *testing.T, bin string, env []string) *storageCluster {
	t.Helper()
	lab := newNetLab(t, 3)
	sc := &storageCluster{t: t, lab: lab, dir: t.TempDir(), bin: bin, env: env}
	sc.names, _ = store.NewNames("", "")
	var err error
	// One auth dir, as an operator copies it to every storage node.
	if sc.auth, err = storagenode.LoadAuth(filepath.Join(sc.dir, "auth"), true); err != nil {
		t.Fatal(err)
	}
	sc.creds = sc.issue(storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "test-operator"})
	for i := 1; i <= 3; i++ {
		sc.servers = append(sc.servers, sc.startNode(i, ""))
	}
	for _, p := range sc.servers {
		p.waitOutput(t, `control server ready`, 90*time.Second)
	}
	return sc
}

// startNode starts storage node i's `control server` (again, from its data
// dir, when it ran before) without waiting for it.
func (sc *storageCluster) startNode(i int, label string) *proc {
	sc.t.Helper()
	return sc.startNodeNamed(i, fmt.Sprintf("s%d", i), label)
}

// startNodeNamed is startNode with the server named name (data dir DIR/name).
func (sc *storageCluster) startNodeNamed(i int, name, label string) *proc {
	sc.t.Helper()
	var routes []string
	for j := 1; j <= len(sc.lab.ns); j++ {
		routes = append(routes, sc.lab.addr(j)+":6222")
	}
	return start(sc.t, fmt.Sprintf("storage node %s%s", name, label), sc.env, "ip", "netns", "exec", sc.lab.ns[i-1], cmp.Or(sc.bin, bins.control), "server",
		"--data", filepath.Join(sc.dir, name), "--listen", sc.lab.addr(i)+":4222",
		"--name", name, "--cluster-name", "edge", "--cluster-listen", sc.lab.addr(i)+":6222",
		"--routes", strings.Join(routes, ","), "--auth", "on", "--auth-dir", filepath.Join(sc.dir, "auth"),
		"--stun-listen", "")
}

func (sc *storageCluster) issue(r storagenode.CredsRequest) string {
	sc.t.Helper()
	b, err := sc.auth.IssueCreds(r)
	if err != nil {
		sc.t.Fatal(err)
	}
	f, err := os.CreateTemp(sc.dir, r.Role+"-*.creds")
	if err != nil {
		sc.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		sc.t.Fatal(err)
	}
	return f.Name()
}

func (sc *storageCluster) url(i int) string { return fmt.Sprintf("nats://%s:4222", sc.lab.addr(i)) }

// control runs a CLI command against node i.
func (sc *storageCluster) control(i int, args ...string) (string, string, int) {
	sc.t.Helper()
	return runControl(sc.t, []string{"EDGEPLANE_NATS=" + sc.url(i), "EDGEPLANE_NATS_CREDS=" + sc.creds,
		"EDGEPLANE_SIGNING_KEY=" + filepath.Join(sc.dir, "s1", signers.SignerFile)}, args...)
}

// open connects a store client to node i with creds.
func (sc *storageCluster) open(i int, creds string) *store.Store {
	sc.t.Helper()
	return sc.openURL(sc.url(i), creds)
}

// openURL connects a store client to the nodes url names with creds; it
// trusts the cluster's anchor and signs as the operator's CLI does, with
// node s1's signer.
func (sc *storageCluster) openURL(url, creds string) *store.Store {
	sc.t.Helper()
	nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: creds, Name: sc.t.Name()})
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, err := store.Open(ctx, nc, sc.names)
	if err != nil {
		sc.t.Fatal(err)
	}
	anchor, err := store.ResolveAnchor("", creds, "")
	if err != nil {
		sc.t.Fatal(err)
	}
	s.TrustAnchor(anchor)
	signer, err := signing.OpenKeyFile(filepath.Join(sc.dir, "s1", signers.SignerFile))
	if err != nil {
		sc.t.Fatal(err)
	}
	s.SignWith(signer)
	return s
}

// startAgent starts machine's agent, with agent-role credentials, joined
// by a fresh invite and connected to the nodes given (their URLs, in
// order), and returns its credentials file.
func (sc *storageCluster) startAgent(machine string, nodes ...int) string {
	t := sc.t
	t.Helper()
	creds := sc.issue(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: machine})
	token := ""
	eventually(t, 30*time.Second, "an invite", func() bool {
		// The agent joins at 127.0.0.1 on a store other boxes reach:
		// the invite must say so (the operator's word, not the agent's).
		out, _, code := sc.control(nodes[0], "machine", "invite", "--address", "127.0.0.1")
		token = strings.TrimSpace(out)
		return code == 0
	})
	var urls []string
	for _, i := range nodes {
		urls = append(urls, sc.url(i))
	}
	dir := filepath.Join(sc.dir, "agent-"+machine)
	t.Cleanup(func() { killAgentInstances(dir) })
	agent := start(t, "agent "+machine, []string{"EDGEPLANE_NATS=" + strings.Join(urls, ","), "EDGEPLANE_NATS_CREDS=" + creds},
		bins.control, "agent", "--data", dir, "--join", token, "--machine", machine, "--stop-grace", "2s")
	agent.waitOutput(t, `agent serving`, 30*time.Second)
	return creds
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
