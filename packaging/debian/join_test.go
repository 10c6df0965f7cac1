package debian

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// TestJoinOnAPackageInstall installs the built packages, runs a storage
// node (`control server --auth on`, as a fleet's) and joins this box with
// one invite: `control join TOKEN --gateway --mesh`. It checks every file
// join wrote (owner, mode, content) and what it would start (this machine
// has no systemd), then starts the agent, the gateway and meshd from those
// files exactly as their units would (ExecStart with the env file's
// arguments, as the unit's user, with its capabilities) and waits for the
// machine's heartbeat, the gateway's report and meshd's heartbeat. A wrong
// invite and a used one are refused with nothing written; a second join
// changes nothing; `control leave` removes what join wrote. Everything runs
// in a network namespace of its own: the packaged gateway takes ports 80,
// 443 and 2019.
func TestJoinOnAPackageInstall(t *testing.T) {
	install(t, "1.2.4-test")
	for _, tool := range []string{"ip", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	b := &box{t: t, ns: fmt.Sprintf("epjoin%d", os.Getpid())}
	if out, err := exec.Command("ip", "netns", "add", b.ns).CombinedOutput(); err != nil {
		t.Skipf("no network namespace: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", b.ns).Run() })
	b.must("ip", "link", "set", "lo", "up")

	// The storage node: its own data dir, TLS and credentials on. The dir
	// is a tmpfs of its own: JetStream sizes what it accepts from the
	// space free where its store is, and on a disk other tests fill up the
	// store's buckets (they reserve tens of GiB) could be refused.
	srvRoot := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64g,mode=0700", "tmpfs", srvRoot).CombinedOutput(); err != nil {
		t.Fatalf("tmpfs for the storage node: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", srvRoot).Run() })
	srvDir := filepath.Join(srvRoot, "server")
	srv := b.start("server", nil, "", "/usr/bin/control", "server", "--data", srvDir, "--auth", "on",
		"--listen", "127.0.0.1:4222", "--enroll-listen", "127.0.0.1:4223", "--stun-listen", "127.0.0.1:0")
	srv.wait(t, `control server ready`, 30*time.Second)
	creds := regexp.MustCompile(`this node's control credentials: (\S+)`).FindStringSubmatch(srv.text())
	if creds == nil {
		t.Fatalf("no control credentials:\n%s", srv.text())
	}
	const url = "tls://127.0.0.1:4222"
	b.cli = []string{"EDGEPLANE_NATS=" + url, "EDGEPLANE_NATS_CREDS=" + creds[1], "EDGEPLANE_SIGNING_KEY=" + filepath.Join(srvDir, "signer.nk")}
	// The invite names the fleet's CA and the storage node: the box
	// needs nothing else.
	token := strings.TrimSpace(b.mustEnv(b.cli, "/usr/bin/control", "machine", "invite", "--region", "eu", "--store", url))

	packaged := b.files("/etc/edgeplane", "/var/lib/edgeplane")
	other := newLayout(t)
	join := []string{"/usr/bin/control", "join", "--gateway", "--mesh", "--machine", "box1", "--mesh-mode", "netstack", "--mesh-port", "0"}

	// A wrong invite (this fleet's CA, an unknown secret): refused by the
	// storage node, nothing written.
	wrong := store.InviteTokenPrefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA." + strings.SplitN(token, ".", 2)[1]
	out, code := b.run(append(join, wrong)...)
	if code != 1 || !strings.Contains(out, "error: not_found: invite unknown or expired") {
		t.Fatalf("a wrong invite: exit %d\n%s", code, out)
	}
	b.same(packaged, b.files("/etc/edgeplane", "/var/lib/edgeplane"), "a wrong invite")

	out = b.must(append(join, token)...)
	t.Logf("control join said:\n%s", out)
	for _, want := range []string{"joined as machine box1 (roles agent, gateway, mesh)",
		"systemd is not running on this box; would run: systemctl enable --now edgeplane-agent.service edgeplane-gateway.service edgeplane-meshd.service"} {
		if !strings.Contains(out, want) {
			t.Fatalf("join said:\n%s\nwant %q", out, want)
		}
	}
	ep, err := user.Lookup("edgeplane")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/var/lib/edgeplane/agent":                    "root 0700",
		"/var/lib/edgeplane/agent/agent.json":         "root 0600",
		"/var/lib/edgeplane/agent/agent.creds":        "root 0600",
		"/var/lib/edgeplane/gateway":                  "edgeplane 0700",
		"/var/lib/edgeplane/gateway/gateway.creds":    "edgeplane 0600",
		"/var/lib/edgeplane/meshd":                    "edgeplane 0700",
		"/var/lib/edgeplane/meshd/mesh.creds":         "edgeplane 0600",
		"/var/lib/edgeplane/meshd/state.json":         "edgeplane 0600",
		"/var/lib/edgeplane/join/joined.json":         "root 0600",
		"/var/lib/edgeplane/join/packaged/caddy.json": "root 0640",
		"/etc/edgeplane/caddy.json":                   "root 0640",
		"/etc/edgeplane/agent.env":                    "root 0640",
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("after join: %v", err)
			continue
		}
		owner := "root"
		if fi.Sys().(*syscall.Stat_t).Uid == uint32(atoi(ep.Uid)) {
			owner = "edgeplane"
		}
		if got := fmt.Sprintf("%s %04o", owner, fi.Mode().Perm()); got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
	if fi, err := os.Stat("/etc/edgeplane/caddy.json"); err == nil && fi.Sys().(*syscall.Stat_t).Gid != uint32(atoi(ep.Gid)) {
		t.Errorf("caddy.json is not the edgeplane group's to read")
	}
	// Each credentials file carries the fleet's CA bundle; each config
	// names the store and the credentials.
	for _, f := range []string{"/var/lib/edgeplane/agent/agent.creds", "/var/lib/edgeplane/gateway/gateway.creds", "/var/lib/edgeplane/meshd/mesh.creds"} {
		if c, err := os.ReadFile(f); err != nil || !bytes.Contains(c, []byte(store.BundleHeader)) {
			t.Errorf("%s carries no CA bundle (%v)", f, err)
		}
	}
	var caddy struct {
		Storage map[string]any `json:"storage"`
		Apps    struct {
			Edgeplane map[string]any `json:"edgeplane"`
		} `json:"apps"`
	}
	if c, err := os.ReadFile("/etc/edgeplane/caddy.json"); err != nil || json.Unmarshal(c, &caddy) != nil ||
		caddy.Storage["nats_url"] != url || caddy.Apps.Edgeplane["creds_file"] != "/var/lib/edgeplane/gateway/gateway.creds" || caddy.Apps.Edgeplane["gateway_name"] != "box1" {
		t.Errorf("caddy.json: %v %+v", err, caddy)
	}
	if env, _ := os.ReadFile("/etc/edgeplane/agent.env"); !regexp.MustCompile(`(?m)^AGENT_ARGS=--nats tls://127.0.0.1:4222 --gateway-releases`).Match(env) {
		t.Errorf("agent.env:\n%s", env)
	}
	var mesh struct {
		CredsFile string `json:"creds_file"`
		NATSURL   string `json:"nats_url"`
	}
	if c, err := os.ReadFile("/var/lib/edgeplane/meshd/state.json"); err != nil || json.Unmarshal(c, &mesh) != nil || mesh.CredsFile != "/var/lib/edgeplane/meshd/mesh.creds" || mesh.NATSURL != url {
		t.Errorf("meshd state: %v %+v", err, mesh)
	}
	joined := b.files("/etc/edgeplane", "/var/lib/edgeplane")
	var rec struct{ Files []string }
	if c, err := os.ReadFile("/var/lib/edgeplane/join/joined.json"); err != nil || json.Unmarshal(c, &rec) != nil {
		t.Fatalf("join record: %v", err)
	}

	// Again, on the joined box: nothing redeemed, nothing written.
	if out := b.must(append(join, token)...); !strings.Contains(out, "already joined as box1: nothing changed") {
		t.Fatalf("second join:\n%s", out)
	}
	b.same(joined, b.files("/etc/edgeplane", "/var/lib/edgeplane"), "a second join")
	// The invite, on another box (another state dir): used, refused,
	// nothing written there.
	before := b.files(other.etc, other.state)
	out, code = b.run(append(join[:len(join):len(join)], "--machine", "box2", "--etc", other.etc, "--state", other.state, token)...)
	if code != 1 || !strings.Contains(out, "invite already used by machine box1") {
		t.Fatalf("a used invite: exit %d\n%s", code, out)
	}
	b.same(before, b.files(other.etc, other.state), "a used invite")
	// An invite the admission refuses (it pins another address) after
	// meshd registered: the mesh peer is taken out again, nothing written.
	pinned := strings.TrimSpace(b.mustEnv(b.cli, "/usr/bin/control", "machine", "invite", "--address", "10.9.9.9", "--store", url))
	out, code = b.run(append(join[:len(join):len(join)], "--machine", "box2", "--advertise", "10.1.1.1", "--etc", other.etc, "--state", other.state, pinned)...)
	if code != 1 || !strings.Contains(out, "nothing was written on this box, but the invite is spent for machine box2") {
		t.Fatalf("a refused admission: exit %d\n%s", code, out)
	}
	b.same(before, b.files(other.etc, other.state), "a refused admission")
	if out, code := b.runEnv(append(b.cli, "EDGEPLANE_JOIN_PROBE=box2-gone"), os.Args[0], "-test.run", "^TestProbeStore$", "-test.v"); code != 0 || !strings.Contains(out, "--- PASS: TestProbeStore") {
		t.Fatalf("box2's mesh peer after its join failed:\n%s", out)
	}

	// The services, from the files join wrote, as their units run them.
	started := time.Now()
	for _, u := range []string{"edgeplane-meshd", "edgeplane-agent", "edgeplane-gateway"} {
		b.unit(u)
	}
	b.eventually("box1's heartbeat, its gateway's report and its meshd's heartbeat", 60*time.Second, func() error {
		out, code := b.runEnv(append(b.cli, "EDGEPLANE_JOIN_PROBE=1"), os.Args[0], "-test.run", "^TestProbeStore$", "-test.v")
		if code != 0 || !strings.Contains(out, "--- PASS: TestProbeStore") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
	t.Logf("agent, gateway and meshd reported %s after they started", time.Since(started).Round(time.Millisecond))

	// Leave: the units would be stopped (here: the processes are), the
	// mesh peer goes, every file join wrote goes, the packaged configs
	// come back.
	for _, p := range b.procs[1:] {
		p.stop()
	}
	out = b.must("/usr/bin/control", "leave")
	t.Logf("control leave said:\n%s", out)
	for _, want := range []string{"would run: systemctl disable --now edgeplane-agent.service edgeplane-gateway.service edgeplane-meshd.service",
		"removed /var/lib/edgeplane/agent/agent.json", "restored the packaged /etc/edgeplane/caddy.json", "meshd left the mesh",
		"control machine rm box1"} {
		if !strings.Contains(out, want) {
			t.Errorf("leave said:\n%s\nwant %q", out, want)
		}
	}
	// What leave leaves to the control plane works: the machine goes.
	b.mustEnv(b.cli, "/usr/bin/control", "machine", "rm", "box1")
	after := b.files("/etc/edgeplane", "/var/lib/edgeplane")
	for _, f := range []string{"/etc/edgeplane/caddy.json", "/etc/edgeplane/agent.env"} {
		if !sameContent(after[f], packaged[f]) {
			t.Errorf("%s is not the packaged one after leave: %q", f, after[f])
		}
	}
	for _, f := range rec.Files {
		if _, ok := after[f]; ok {
			t.Errorf("%s still there after leave", f)
		}
	}
	if _, ok := after["/var/lib/edgeplane/join"]; ok || len(rec.Files) < 6 {
		t.Errorf("the join record is still there after leave, or named too few files: %v", rec.Files)
	}
}

// TestProbeStore is TestJoinOnAPackageInstall's eyes inside its network
// namespace (run there by it, with the CLI's environment): box1's agent
// beats, its gateway reported and its meshd beats; or, asked about box2,
// that it left no mesh peer.
func TestProbeStore(t *testing.T) {
	if os.Getenv("EDGEPLANE_NATS_CREDS") == "" || os.Getenv("EDGEPLANE_JOIN_PROBE") == "" {
		t.Skip("run by TestJoinOnAPackageInstall")
	}
	cfg := store.Config{NATSURL: os.Getenv("EDGEPLANE_NATS"), CredsFile: os.Getenv("EDGEPLANE_NATS_CREDS")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cfg.Dial(ctx, store.ConnectOptions{Name: t.Name(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.NC.Close()
	if os.Getenv("EDGEPLANE_JOIN_PROBE") == "box2-gone" {
		if _, err := s.MeshPeer(ctx, "box2"); !store.HasCode(err, store.CodeNotFound) {
			t.Fatalf("box2's mesh peer: %v, want not_found", err)
		}
		return
	}
	if beat, err := s.MachineBeatOf(ctx, "box1"); err != nil || time.Since(beat.At) > time.Minute {
		t.Errorf("no heartbeat of box1's agent: %v", err)
	}
	found := false
	_ = s.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
		found = found || o.Gateway == "box1"
		return nil
	})
	if !found {
		t.Error("no report of box1's gateway")
	}
	if hb, err := s.MeshHeartbeatOf(ctx, "box1"); err != nil || time.Since(hb.At) > time.Minute {
		t.Errorf("no heartbeat of box1's meshd: %v", err)
	}
}

// box runs commands in the test's network namespace and keeps the
// processes it started.
type box struct {
	t     *testing.T
	ns    string
	cli   []string // the operator's CLI environment: store, credentials, signer
	procs []*proc
}

// command is argv in the namespace, as user (with the ambient capabilities
// caps, as systemd's AmbientCapabilities= gives them) or as root ("").
func (b *box) command(env []string, usr string, caps []string, argv ...string) *exec.Cmd {
	args := []string{"netns", "exec", b.ns}
	if usr != "" {
		args = append(args, "setpriv", "--reuid", usr, "--regid", usr, "--init-groups")
		if len(caps) > 0 {
			args = append(args, "--inh-caps", strings.Join(caps, ","), "--ambient-caps", strings.Join(caps, ","))
		}
		args = append(args, "--")
	}
	cmd := exec.Command("ip", append(args, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// run runs argv as root to its end: its output and exit status.
func (b *box) run(argv ...string) (string, int) {
	b.t.Helper()
	return b.runEnv(nil, argv...)
}

// runEnv is run with env added to the test's environment.
func (b *box) runEnv(env []string, argv ...string) (string, int) {
	b.t.Helper()
	out, err := b.command(env, "", nil, argv...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		b.t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	return string(out), 0
}

func (b *box) must(argv ...string) string {
	b.t.Helper()
	return b.mustEnv(nil, argv...)
}

func (b *box) mustEnv(env []string, argv ...string) string {
	b.t.Helper()
	out, code := b.runEnv(env, argv...)
	if code != 0 {
		b.t.Fatalf("%s: exit %d\n%s", strings.Join(argv, " "), code, out)
	}
	return out
}

func (b *box) eventually(what string, within time.Duration, check func() error) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range b.procs {
				b.t.Logf("%s:\n%s", p.name, p.text())
			}
			b.t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(time.Second)
	}
}

// proc is a process the box started, with its output.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) text() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *proc) wait(t *testing.T, re string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !regexp.MustCompile(re).MatchString(p.text()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q within %s:\n%s", p.name, re, within, p.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (b *box) start(name string, env []string, usr string, argv ...string) *proc {
	return b.startCaps(name, env, usr, nil, argv...)
}

func (b *box) startCaps(name string, env []string, usr string, caps []string, argv ...string) *proc {
	b.t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = b.command(env, usr, caps, argv...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	b.procs = append(b.procs, p)
	b.t.Cleanup(p.stop)
	return p
}

// unit starts the packaged unit name as systemd would: its ExecStart with
// $VARS from its EnvironmentFile and Environment=, as its User= with its
// AmbientCapabilities=, its RuntimeDirectory= made for it.
func (b *box) unit(name string) *proc {
	b.t.Helper()
	f, err := os.Open("/usr/lib/systemd/system/" + name + ".service")
	if err != nil {
		b.t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	var execStart, usr string
	var caps, env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "ExecStart":
			execStart = v
		case "User":
			usr = v
		case "AmbientCapabilities":
			for _, c := range strings.Fields(v) {
				caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
			}
		case "Environment":
			env = append(env, strings.Fields(v)...)
		case "EnvironmentFile":
			ef, err := os.ReadFile(strings.TrimPrefix(v, "-"))
			if err != nil {
				b.t.Fatal(err)
			}
			for _, l := range strings.Split(string(ef), "\n") {
				if ek, ev, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
					vars[ek] = ev
				}
			}
		case "RuntimeDirectory":
			dir := "/run/" + v
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.t.Fatal(err)
			}
			b.t.Cleanup(func() { os.RemoveAll(dir) })
			if usr != "" {
				if u, err := user.Lookup(usr); err == nil {
					_ = os.Chown(dir, atoi(u.Uid), atoi(u.Gid))
				}
			}
		}
	}
	var argv []string
	for _, w := range strings.Fields(execStart) {
		if strings.HasPrefix(w, "$") {
			argv = append(argv, strings.Fields(vars[w[1:]])...)
			continue
		}
		argv = append(argv, w)
	}
	return b.startCaps(name, env, usr, caps, argv...)
}

// files is every file and dir under roots: owner, mode and, for a file,
// content and mtime (a dir's mtime changes with the staging dir join
// makes and removes in it: not a write).
func (b *box) files(roots ...string) map[string]string {
	b.t.Helper()
	out := map[string]string{}
	for _, r := range roots {
		err := filepath.Walk(r, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			v := fmt.Sprintf("%d:%d %v", st.Uid, st.Gid, fi.Mode())
			if !fi.IsDir() {
				c, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				v = fmt.Sprintf("%d %s %s", fi.ModTime().UnixNano(), v, c)
			}
			out[p] = v
			return nil
		})
		if err != nil {
			b.t.Fatal(err)
		}
	}
	return out
}

// sameContent says whether two files' entries (files) differ in owner,
// mode or content, mtime aside.
func sameContent(a, b string) bool {
	_, a, _ = strings.Cut(a, " ")
	_, b, _ = strings.Cut(b, " ")
	return a == b
}

// same fails the test for every file that differs between before and after.
func (b *box) same(before, after map[string]string, what string) {
	b.t.Helper()
	for p, v := range after {
		if w, ok := before[p]; !ok {
			b.t.Errorf("%s wrote %s", what, p)
		} else if w != v {
			b.t.Errorf("%s changed %s", what, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			b.t.Errorf("%s removed %s", what, p)
		}
	}
}

// layout is a second box's config and state dirs: the packaged configs
// copied, an empty state dir.
type layout struct{ etc, state string }

// newLayout makes one from this box's configs.
func newLayout(t *testing.T) layout {
	t.Helper()
	l := layout{etc: t.TempDir(), state: t.TempDir()}
	for _, f := range []string{"agent.env", "caddy.json"} {
		c, err := os.ReadFile("/etc/edgeplane/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(l.etc, f), c, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
