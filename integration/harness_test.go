// Package integration runs edgeplane's real binaries together: the control
// server on its embedded NATS, agents as separate processes, the example
// app as their instances, and (in the gateway tests) the custom Caddy.
package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// bins holds the binaries TestMain builds once.
var bins struct {
	dir     string
	control string // built with -tags failpoints so crash tests can use it
	hello   string
	caddy   string // the custom Caddy
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgeplane-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.dir = dir
	bins.control = filepath.Join(dir, "control")
	bins.hello = filepath.Join(dir, "hello")
	bins.caddy = filepath.Join(dir, "caddy")
	for _, b := range []struct{ out, pkg, tags string }{
		{bins.control, "../control", "failpoints"},
		{bins.hello, "../examples/hello", ""},
		{bins.caddy, "../caddymodule/cmd/caddy", ""},
	} {
		args := []string{"build", "-o", b.out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		cmd := exec.Command("go", append(args, b.pkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", b.pkg, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// outputLog keeps a process's output for assertions and for the failure
// report.
type outputLog struct {
	mu  sync.Mutex
	out bytes.Buffer
}

func (o *outputLog) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.Write(b)
}

func (o *outputLog) output() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out.String()
}

// proc is a running binary and its output.
type proc struct {
	outputLog
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// waitOutput waits until the process printed something matching re.
func (p *proc) waitOutput(t *testing.T, re string, timeout time.Duration) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for {
		if m := rx.FindStringSubmatch(p.output()); m != nil {
			return m
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited (%v) before printing %q:\n%s", p.name, p.err, re, p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %s:\n%s", p.name, re, timeout, p.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop ends the process and waits for it.
func (p *proc) stop(sig syscall.Signal) {
	p.signal(sig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.signal(syscall.SIGKILL)
		<-p.done
	}
}

func start(t *testing.T, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.output())
		}
	})
	return p
}

// cluster is one control server and its agents.
type cluster struct {
	t      *testing.T
	dir    string
	url    string
	server *proc
	agents map[string]*proc
	store  *store.Store
	// serverArgs are extra `control server` flags; agentArgs extra
	// `control agent` flags for the agents join starts.
	serverArgs, agentArgs []string
	// netns, if set, is the network namespace the server runs in.
	netns string
	// creds, when the server requires credentials (--auth on), is the
	// control-role credentials file the server wrote; clients use it, and
	// agents get their own agent-role credentials.
	creds string
	// issueArgs are extra `control creds issue` flags for the credentials
	// the cluster issues its clients (a --ttl).
	issueArgs []string
	// serverBin (the server and the CLI) and agentBin (the agents join
	// starts) are another release's control binary in the skew tests;
	// bins.control when empty.
	serverBin, agentBin string
	// issue and signer, when set, stand in for the server's auth dir and
	// signer key: the control plane is a storage cluster's nodes
	// (storageCluster.fleet), not one server of the test's own.
	issue  func(role, machine string) string
	signer string
	// inviteArgs are extra `control machine invite` flags for the boxes
	// the shared helpers join (an --address on a store others reach).
	inviteArgs []string
}

func (c *cluster) serverBinary() string { return cmp.Or(c.serverBin, bins.control) }

func (c *cluster) agentBinary() string { return cmp.Or(c.agentBin, bins.control) }

// newCluster starts `control server` (no local agent) on a free loopback
// port and connects a store client to it.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	return c
}

// newAuthCluster is newCluster with credentials required on every
// connection (`control server --auth on`).
func newAuthCluster(t *testing.T, serverArgs ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: append([]string{"--auth", "on"}, serverArgs...)}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	return c
}

func (c *cluster) startServer(listen string, extraEnv ...string) {
	t := c.t
	args := append([]string{"server", "--data", c.serverDir(), "--listen", listen, "--stun-listen", "127.0.0.1:0,127.0.0.1:0"}, c.serverArgs...)
	if c.netns != "" {
		c.server = start(t, "control server", extraEnv, "ip", append([]string{"netns", "exec", c.netns, c.serverBinary()}, args...)...)
	} else {
		c.server = start(t, "control server", extraEnv, c.serverBinary(), args...)
	}
	// tls:// when the node speaks TLS; clients speak it from the fleet CA
	// their credentials carry, whatever the scheme.
	m := c.server.waitOutput(t, `embedded NATS with JetStream on (?:nats|tls)://(\S+)`, 15*time.Second)
	c.server.waitOutput(t, `control server ready`, 15*time.Second)
	c.url = "nats://" + m[1]
	if cm := regexp.MustCompile(`this node's control credentials: (\S+)`).FindStringSubmatch(c.server.output()); cm != nil {
		c.creds = cm[1]
	}
	nc, err := store.Connect(store.ConnectOptions{URL: c.url, CredsFile: c.creds, Name: t.Name(), ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c.store, err = store.Open(ctx, nc, names); err != nil {
		t.Fatal(err)
	}
	// The test writes intent as the server would: signed with its key,
	// verified under the root its credentials (or the store) name.
	signer, err := signing.OpenKeyFile(c.signerFile())
	if err != nil {
		t.Fatal(err)
	}
	c.store.SignWith(signer)
	anchor, err := store.ResolveAnchor("", c.creds, "")
	if err != nil {
		t.Fatal(err)
	}
	c.store.TrustAnchor(anchor)
}

// signerFile is the server's signer key, which the CLI signs with too.
func (c *cluster) signerFile() string {
	return cmp.Or(c.signer, filepath.Join(c.serverDir(), signers.SignerFile))
}

func (c *cluster) serverDir() string { return filepath.Join(c.dir, "server") }

// issueCreds writes credentials of role (for machine, if set) with
// `control creds issue` on the server's auth dir and returns the file.
func (c *cluster) issueCreds(role, machine string) string {
	c.t.Helper()
	if c.issue != nil {
		return c.issue(role, machine)
	}
	file := filepath.Join(c.dir, role+"-"+machine+".creds")
	args := append([]string{"creds", "issue", "--role", role, "--data", c.serverDir(), "-o", file}, c.issueArgs...)
	if machine != "" {
		args = append(args, "--machine", machine)
	}
	c.mustControl(args...)
	return file
}

// natsEnv is the environment a client process of the cluster needs: the
// URL and, when credentials are required, role's credentials.
func (c *cluster) natsEnv(role, machine string) []string {
	env := []string{"EDGEPLANE_NATS=" + c.url}
	if role == storagenode.RoleControl {
		env = append(env, "EDGEPLANE_SIGNING_KEY="+c.signerFile())
	}
	if c.creds != "" {
		creds := c.creds
		if role != storagenode.RoleControl {
			creds = c.issueCreds(role, machine)
		}
		env = append(env, "EDGEPLANE_NATS_CREDS="+creds)
	}
	return env
}

// control runs one client command and returns stdout, stderr and the exit
// status.
func (c *cluster) control(args ...string) (string, string, int) {
	c.t.Helper()
	return c.controlEnv(nil, args...)
}

// controlEnv is control with extra environment (failpoints).
func (c *cluster) controlEnv(env []string, args ...string) (string, string, int) {
	c.t.Helper()
	return runControlBin(c.t, c.serverBinary(), append(c.natsEnv(storagenode.RoleControl, ""), env...), args...)
}

// runControl runs the control binary with env added to ours and returns
// stdout, stderr and the exit status.
func runControl(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return runControlBin(t, bins.control, env, args...)
}

// runControlBin is runControl with another control binary.
func runControlBin(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running control %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// mustControl runs a command that must succeed.
func (c *cluster) mustControl(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.control(args...)
	if code != 0 {
		c.t.Fatalf("control %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// invite is a fresh `control machine invite` token with c.inviteArgs.
func (c *cluster) invite() string {
	c.t.Helper()
	return strings.TrimSpace(c.mustControl(append([]string{"machine", "invite"}, c.inviteArgs...)...))
}

// join invites and starts an agent for machine id.
func (c *cluster) join(id string, inviteArgs ...string) *proc {
	c.t.Helper()
	token := strings.TrimSpace(c.mustControl(append([]string{"machine", "invite"}, inviteArgs...)...))
	p := start(c.t, "agent "+id, c.natsEnv(storagenode.RoleAgent, id), c.agentBinary(),
		append([]string{"agent", "--data", c.agentDir(id), "--join", token, "--machine", id, "--stop-grace", "2s"}, c.agentArgs...)...)
	p.waitOutput(c.t, `agent serving`, 15*time.Second)
	c.agents[id] = p
	return p
}

// joinIn is join with the agent in network namespace ns, its instances
// listening on and reached at advertise.
func (c *cluster) joinIn(id, ns, advertise string) *proc {
	c.t.Helper()
	token := strings.TrimSpace(c.mustControl("machine", "invite"))
	p := start(c.t, "agent "+id+" (in "+ns+")", c.natsEnv(storagenode.RoleAgent, id), "ip",
		append([]string{"netns", "exec", ns, bins.control, "agent", "--data", c.agentDir(id), "--join", token, "--machine", id,
			"--advertise", advertise, "--stop-grace", "2s"}, c.agentArgs...)...)
	p.waitOutput(c.t, `agent serving`, 15*time.Second)
	c.agents[id] = p
	return p
}

// restartAgent starts machine id's agent again from its data dir alone.
func (c *cluster) restartAgent(id string) *proc {
	c.t.Helper()
	p := start(c.t, "agent "+id+" (restarted)", c.natsEnv(storagenode.RoleAgent, id), bins.control,
		append([]string{"agent", "--data", c.agentDir(id), "--stop-grace", "2s"}, c.agentArgs...)...)
	p.waitOutput(c.t, `agent serving`, 15*time.Second)
	c.agents[id] = p
	return p
}

func (c *cluster) agentDir(id string) string { return filepath.Join(c.dir, "agents", id) }

// killInstances stops every instance any agent of the test started: they
// outlive agents by design, so the test must end them itself.
func (c *cluster) killInstances() {
	for _, pid := range recordedPIDs(filepath.Join(c.dir, "*", "*", "instances", "*.json"),
		filepath.Join(c.dir, "server", "agent", "instances", "*.json")) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// recordedPIDs are the process groups of the instances recorded in the
// agents' state files matching the glob patterns.
func recordedPIDs(patterns ...string) []int {
	var pids []int
	for _, p := range patterns {
		files, _ := filepath.Glob(p)
		for _, f := range files {
			var st struct {
				Runtime struct{ PID int } `json:"runtime"`
			}
			b, _ := os.ReadFile(f)
			if json.Unmarshal(b, &st) == nil && st.Runtime.PID > 0 {
				pids = append(pids, st.Runtime.PID)
			}
		}
	}
	return pids
}

// manifest writes a manifest for the hello app and returns its path.
func (c *cluster) manifest(name, body string) string {
	c.t.Helper()
	body = strings.ReplaceAll(body, "@HELLO@", bins.hello)
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *cluster) instances(ns string) []store.InstanceRecord {
	c.t.Helper()
	var list []store.InstanceRecord
	out := c.mustControl("instances", "--namespace", ns, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		c.t.Fatalf("instances json: %v\n%s", err, out)
	}
	return list
}

// get fetches an instance's / and returns the body.
func get(t *testing.T, addr string) (string, error) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + "/?format=json")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("status %s", resp.Status)
	}
	return string(b), err
}

func addrOf(r store.InstanceRecord) string { return fmt.Sprintf("%s:%d", r.Address, r.Port) }

// lines scans s for lines containing sub.
func lines(s, sub string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// waitReachable waits until machine id's agent answers again (after NATS
// came back).
func (c *cluster) waitReachable(id string) {
	c.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for c.store.Call(context.Background(), id, store.CmdCapacity, store.CapacityRequest{}, nil) != nil {
		if time.Now().After(deadline) {
			c.t.Fatalf("machine %s did not become reachable again", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
