package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// These tests run the real binaries in network namespaces: a control box
// (meshdev: embedded NATS + registrar + STUN) and meshd boxes, each on a
// veth pair into a bridge inside the control box's namespace.

var (
	binOnce sync.Once
	binDir  string
	binErr  error
	nsSeq   atomic.Uint32
)

// TestMain doubles as the tiny HTTP server and client the namespace tests
// run inside namespaces (`ip netns exec <ns> <test binary>`).
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("MESHD_TEST_HTTP_SERVE") != "":
		addr := os.Getenv("MESHD_TEST_HTTP_SERVE")
		err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello over the mesh from %s to %s", addr, r.RemoteAddr)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case os.Getenv("MESHD_TEST_HTTP_GET") != "":
		c := &http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(os.Getenv("MESHD_TEST_HTTP_GET"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		io.Copy(os.Stdout, resp.Body)
		os.Exit(0)
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and TUN (CI runs as root)")
	}
	for _, b := range []string{"ip", "ping"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s (apt-get install iproute2 iputils-ping): %v", b, err)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("needs /dev/net/tun: %v", err)
	}
}

// binaries builds meshd and meshdev once per test binary.
func binaries(t *testing.T) (meshd, meshdev string) {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "meshd-bin-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir, ".", "./cmd/meshdev").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "meshd"), filepath.Join(binDir, "meshdev")
}

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// topo is a control namespace with a bridge and n box namespaces.
type topo struct {
	ctl   string
	boxes []string // namespace names
	addrs []string // box underlay addresses
}

const ctlAddr = "10.222.0.1"

func newTopo(t *testing.T, n int) *topo {
	t.Helper()
	id := fmt.Sprintf("%04x%02x", os.Getpid()&0xffff, nsSeq.Add(1)&0xff)
	tp := &topo{ctl: "mdc" + id}
	sh(t, "ip", "netns", "add", tp.ctl)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", tp.ctl).Run() })
	ns := func(name string, args ...string) {
		sh(t, append([]string{"ip", "-n", name}, args...)...)
	}
	ns(tp.ctl, "link", "set", "lo", "up")
	ns(tp.ctl, "link", "add", "br0", "type", "bridge")
	ns(tp.ctl, "addr", "add", ctlAddr+"/24", "dev", "br0")
	ns(tp.ctl, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		box := fmt.Sprintf("md%s%d", id, i)
		sh(t, "ip", "netns", "add", box)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", box).Run() })
		a, b := fmt.Sprintf("v%s%da", id, i), fmt.Sprintf("v%s%db", id, i)
		sh(t, "ip", "link", "add", a, "netns", tp.ctl, "type", "veth", "peer", "name", b, "netns", box)
		ns(tp.ctl, "link", "set", a, "master", "br0", "up")
		addr := fmt.Sprintf("10.222.0.%d", 10+i)
		ns(box, "link", "set", "lo", "up")
		ns(box, "link", "set", b, "name", "eth0")
		ns(box, "addr", "add", addr+"/24", "dev", "eth0")
		ns(box, "link", "set", "eth0", "up")
		tp.boxes = append(tp.boxes, box)
		tp.addrs = append(tp.addrs, addr)
	}
	return tp
}

// proc is a started process with its output in a log file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

func start(t *testing.T, logPath string, stdin io.Reader, env []string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = f, f, stdin
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", strings.Join(args, " "), err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		p.done <- nil
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.done <- nil
	if t.Failed() {
		b, _ := os.ReadFile(p.log)
		t.Logf("--- %s ---\n%s", p.log, b)
	}
}

// control is a meshdev process driven over stdin.
type control struct {
	p   *proc
	in  io.WriteCloser
	out *bufio.Reader
}

func startControl(t *testing.T, tp *topo, dir string, extra ...string) *control {
	t.Helper()
	_, meshdev := binaries(t)
	pr, pw := io.Pipe()
	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.ctl, meshdev, "--data", filepath.Join(dir, "ctl"),
		"--host", ctlAddr, "--cooldown", "2s"}, extra...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	logf, _ := os.Create(filepath.Join(dir, "meshdev.log"))
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close(); logf.Close() }()
	c := &control{p: &proc{cmd: cmd, log: filepath.Join(dir, "meshdev.log"), done: done}, in: stdin, out: bufio.NewReader(pr)}
	t.Cleanup(func() { c.stop(t) })
	line, err := c.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "READY ") {
		b, _ := os.ReadFile(c.p.log)
		t.Fatalf("meshdev did not start: %q %v\n%s", line, err, b)
	}
	return c
}

func (c *control) ask(t *testing.T, cmd, wantPrefix string) string {
	t.Helper()
	fmt.Fprintln(c.in, cmd)
	line, err := c.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, wantPrefix+" ") {
		t.Fatalf("meshdev %q: %q %v", cmd, line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, wantPrefix+" "))
}

func (c *control) stop(t *testing.T) {
	c.in.Close()
	c.p.stop(t)
}

type box struct {
	ns, dir, machine, meshIP string
	creds                    string // mesh credentials for machine
	run                      *proc
}

// joinBox joins box i with mesh credentials for its machine: the control
// box listens beyond loopback, so NATS requires them.
func joinBox(t *testing.T, tp *topo, c *control, dir string, i int) *box {
	t.Helper()
	return joinNS(t, c, dir, tp.boxes[i], fmt.Sprintf("box%d", i+1))
}

// joinNS joins machine from namespace ns, with extra join flags.
func joinNS(t *testing.T, c *control, dir, ns, machine string, extra ...string) *box {
	t.Helper()
	meshd, _ := binaries(t)
	b := &box{ns: ns, dir: filepath.Join(dir, machine), machine: machine}
	b.creds = c.ask(t, fmt.Sprintf("creds %s %s", b.machine, filepath.Join(dir, b.machine+".creds")), "CREDS")
	tok := c.ask(t, "invite", "INVITE")
	sh(t, append([]string{"ip", "netns", "exec", b.ns, meshd, "join", "--token", tok, "--data", b.dir, "--creds", b.creds,
		"--nats", "tls://" + ctlAddr + ":4222", "--machine", b.machine, "--listen-port", "51820"}, extra...)...)
	st, err := node.LoadState(b.dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.CredsFile != b.creds {
		t.Fatalf("%s state keeps creds %q, want %q", b.machine, st.CredsFile, b.creds)
	}
	b.meshIP = st.MeshIP
	return b
}

func (b *box) start(t *testing.T, extra ...string) {
	t.Helper()
	meshd, _ := binaries(t)
	b.run = start(t, filepath.Join(filepath.Dir(b.dir), b.machine+fmt.Sprintf("-%d.log", time.Now().UnixNano())), nil, nil,
		append([]string{"ip", "netns", "exec", b.ns, meshd, "run", "--data", b.dir,
			"--heartbeat-interval", "300ms", "--reconcile-interval", "500ms", "--stun-interval", "2s"}, extra...)...)
	storetest.Eventually(t, 10*time.Second, b.machine+" status socket", func() bool {
		_, err := node.QueryStatus(context.Background(), b.dir)
		return err == nil
	})
}

func (b *box) status(t *testing.T) *node.Status {
	t.Helper()
	s, err := node.QueryStatus(context.Background(), b.dir)
	if err != nil {
		t.Fatalf("%s status: %v", b.machine, err)
	}
	return s
}

func (b *box) hasPeer(t *testing.T, machine string) bool {
	for _, p := range b.status(t).Peers {
		if p.Machine == machine && p.Active {
			return true
		}
	}
	return false
}

func ping(ns, ip string) bool {
	return exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", ip).Run() == nil
}

func waitPing(t *testing.T, ns, ip, what string) {
	t.Helper()
	storetest.Eventually(t, 20*time.Second, "ping "+what, func() bool { return ping(ns, ip) })
}

// TestNamespaceMesh: three boxes join through the real control box, ping and
// HTTP cross the mesh through kernel TUN interfaces, a leaving box vanishes
// from the others' configs, and a box restarted with NATS down rebuilds its
// tunnels from its cache.
func TestNamespaceMesh(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	tp := newTopo(t, 3)
	c := startControl(t, tp, dir)
	var boxes []*box
	for i := range 3 {
		b := joinBox(t, tp, c, dir, i)
		b.start(t)
		boxes = append(boxes, b)
	}
	for _, from := range boxes {
		for _, to := range boxes {
			if from != to {
				waitPing(t, from.ns, to.meshIP, from.machine+" -> "+to.machine)
			}
		}
	}

	// Without credentials, or with another machine's, a join is refused
	// with a message that says why, and writes nothing.
	meshd, _ := binaries(t)
	tok := c.ask(t, "invite", "INVITE")
	intruder := filepath.Join(dir, "box9")
	for _, tc := range []struct {
		creds []string
		want  string
	}{
		{nil, "requires credentials: pass --creds"},
		{[]string{"--creds", boxes[0].creds}, `register for machine box9 refused by the control plane, nothing was changed`},
	} {
		args := append([]string{"ip", "netns", "exec", boxes[2].ns, meshd, "join", "--token", tok, "--data", intruder,
			"--nats", "tls://" + ctlAddr + ":4222", "--machine", "box9", "--listen-port", "51821"}, tc.creds...)
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Fatalf("join as box9 %v: %v, want an error containing %q:\n%s", tc.creds, err, tc.want, out)
		}
		if _, err := os.Stat(intruder); !os.IsNotExist(err) {
			t.Fatalf("a refused join wrote %s: %v", intruder, err)
		}
	}
	if peers := c.ask(t, "peers", "PEERS"); strings.Contains(peers, "box9") {
		t.Fatalf("a refused join wrote a peer record: %s", peers)
	}
	s := boxes[0].status(t)
	if s.Mode != node.ModeTUN || s.Interface != "mesh0" {
		t.Fatalf("box1 not on the kernel TUN path: %s/%s", s.Mode, s.Interface)
	}
	storetest.Eventually(t, 10*time.Second, "STUN endpoint of box1's WireGuard port", func() bool {
		s := boxes[0].status(t)
		return s.NAT.Endpoint == tp.addrs[0]+":51820" && s.NAT.Type == node.NATOpen
	})

	// HTTP from box1 to a server on box2's mesh IP.
	self, _ := os.Executable()
	start(t, filepath.Join(dir, "http.log"), nil, []string{"MESHD_TEST_HTTP_SERVE=" + boxes[1].meshIP + ":8080"},
		"ip", "netns", "exec", boxes[1].ns, self)
	var body string
	storetest.Eventually(t, 10*time.Second, "HTTP box1 -> box2 over the mesh", func() bool {
		cmd := exec.Command("ip", "netns", "exec", boxes[0].ns, self)
		cmd.Env = append(os.Environ(), "MESHD_TEST_HTTP_GET=http://"+boxes[1].meshIP+":8080/")
		out, err := cmd.Output()
		body = string(out)
		return err == nil
	})
	if want := "from " + boxes[1].meshIP + ":8080 to " + boxes[0].meshIP + ":"; !strings.Contains(body, want) {
		t.Fatalf("HTTP body %q lacks %q", body, want)
	}

	// box3 leaves (with the credentials saved at join): gone from box1's
	// and box2's device configs.
	sh(t, "ip", "netns", "exec", boxes[2].ns, meshd, "leave", "--data", boxes[2].dir)
	for _, b := range boxes[:2] {
		storetest.Eventually(t, 10*time.Second, "box3 gone from "+b.machine, func() bool { return !b.hasPeer(t, "box3") })
	}
	select {
	case <-boxes[2].run.done:
		boxes[2].run.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("box3's meshd still running after leave")
	}
	if out, err := exec.Command("ip", "-n", boxes[2].ns, "link", "show", "mesh0").CombinedOutput(); err == nil {
		t.Fatalf("box3's mesh0 still exists after leave: %s", out)
	}

	// The control box goes down; box1 restarts from its cache.
	c.stop(t)
	boxes[0].run.stop(t)
	boxes[0].start(t)
	if s := boxes[0].status(t); s.Control.Source != "cache" || s.Control.Connected {
		t.Fatalf("box1 after restart: %+v", s.Control)
	}
	waitPing(t, boxes[0].ns, boxes[1].meshIP, "box1 -> box2 rebuilt from cache with NATS down")
	waitPing(t, boxes[1].ns, boxes[0].meshIP, "box2 -> box1 with NATS down")
}

// referenceWireGuard finds or installs the reference wireguard-go binary.
func referenceWireGuard(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MESHD_WIREGUARD_GO"); p != "" {
		return p
	}
	for _, n := range []string{"wireguard-go", "wireguard"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	gobin := filepath.Join(binDirOr(t), "ref")
	cmd := exec.Command("go", "install", "golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446")
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-mod=mod")
	cmd.Dir = os.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("reference wireguard-go not available (set MESHD_WIREGUARD_GO or put it on PATH): %v\n%s", err, out)
	}
	return filepath.Join(gobin, "wireguard")
}

func binDirOr(t *testing.T) string {
	binaries(t)
	return binDir
}

// TestInteropReferenceWireGuard: a WireGuard peer that is not ours, set up
// with `wg`, talks to a meshd node through the mesh. It runs against the
// reference wireguard-go binary, and against the kernel module where the
// kernel has one.
func TestInteropReferenceWireGuard(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("wg"); err != nil {
		t.Skipf("needs wg (apt-get install wireguard-tools): %v", err)
	}
	for _, kind := range []string{"wireguard-go", "kernel"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			tp := newTopo(t, 2)
			if kind == "kernel" {
				probe := "wgk" + tp.ctl[3:]
				if out, err := exec.Command("ip", "-n", tp.boxes[1], "link", "add", probe, "type", "wireguard").CombinedOutput(); err != nil {
					t.Skipf("kernel has no WireGuard module (`ip link add type wireguard`: %s); the userspace half covers interop",
						strings.TrimSpace(string(out)))
				}
				sh(t, "ip", "-n", tp.boxes[1], "link", "del", probe)
			}
			c := startControl(t, tp, dir)
			b := joinBox(t, tp, c, dir, 0)
			b.start(t)

			// The foreign peer: keys from wg, an interface from wireguard-go
			// or the kernel, configured with wg.
			priv := strings.TrimSpace(sh(t, "wg", "genkey"))
			pubCmd := exec.Command("wg", "pubkey")
			pubCmd.Stdin = strings.NewReader(priv + "\n")
			pubOut, err := pubCmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			pub := strings.TrimSpace(string(pubOut))
			extIP := c.ask(t, fmt.Sprintf("static ext1 %s %s:51820", pub, tp.addrs[1]), "STATIC")
			ifc := "wg" + tp.ctl[3:] // unique: wg's UAPI sockets live in one /var/run/wireguard
			ns := tp.boxes[1]
			if kind == "kernel" {
				sh(t, "ip", "-n", ns, "link", "add", ifc, "type", "wireguard")
			} else {
				ref := referenceWireGuard(t)
				start(t, filepath.Join(dir, "wireguard-go.log"), nil, []string{"LOG_LEVEL=error"},
					"ip", "netns", "exec", ns, ref, "-f", ifc)
				storetest.Eventually(t, 10*time.Second, "wireguard-go interface", func() bool {
					return exec.Command("ip", "-n", ns, "link", "show", ifc).Run() == nil &&
						exec.Command("ip", "netns", "exec", ns, "wg", "show", ifc).Run() == nil
				})
			}
			keyFile := filepath.Join(dir, "ext.key")
			os.WriteFile(keyFile, []byte(priv+"\n"), 0o600)
			meshPub := b.status(t).PublicKey
			sh(t, "ip", "netns", "exec", ns, "wg", "set", ifc, "private-key", keyFile, "listen-port", "51820",
				"peer", meshPub, "endpoint", tp.addrs[0]+":51820", "allowed-ips", b.meshIP+"/32", "persistent-keepalive", "25")
			sh(t, "ip", "-n", ns, "addr", "add", extIP+"/16", "dev", ifc)
			sh(t, "ip", "-n", ns, "link", "set", ifc, "up")

			storetest.Eventually(t, 10*time.Second, "meshd adds the static peer", func() bool { return b.hasPeer(t, "ext1") })
			waitPing(t, ns, b.meshIP, "foreign "+kind+" -> meshd")
			waitPing(t, b.ns, extIP, "meshd -> foreign "+kind)
			out := sh(t, "ip", "netns", "exec", ns, "wg", "show", ifc, "latest-handshakes")
			if !strings.Contains(out, meshPub) {
				t.Fatalf("wg show lacks meshd's key: %s", out)
			}
			var peers []map[string]any
			_ = json.Unmarshal([]byte(c.ask(t, "peers", "PEERS")), &peers)
			if len(peers) != 2 {
				t.Fatalf("peer records: %v", peers)
			}
		})
	}
}
