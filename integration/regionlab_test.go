package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// The multi-region lab (issue 40): three regions, each a network
// namespace holding a gateway (the custom Caddy with the edgeplane and dns
// apps) and two machines (agents, each with an address of its own in the
// region's namespace, invited with --region and --address), all behind one
// router namespace. The control server runs in the root namespace and is
// reached from every region without delay; between regions packets take
// the round trips of labRTT, none within one.
//
// The kernel has no netem, so the delay is made in user space: the router
// sends a packet that crosses regions (policy routing: iif of the source
// region, from its network, to another region's network) into the TUN
// device dly0, where delayrelay (internal/netlab) holds it for its pair's
// one-way delay and writes it back; from dly0 the kernel forwards it by the
// main table. Packets from or to the root namespace (the server, the
// test's clients) never enter dly0.
//
//	root ns 10.215.0.1 ── up0 10.215.0.254 ┐ router ns (ip_forward, rp_filter 0, dly0)
//	ams ns  10.215.1.{1,2,10} ── r1 .1.254 ┤
//	fra ns  10.215.2.{1,2,10} ── r2 .2.254 ┤
//	tyo ns  10.215.3.{1,2,10} ── r3 .3.254 ┘
//
// .1 and .2 are the region's machines (their agents advertise them, their
// instances listen there), .10 its gateway.

// labRegions are the lab's regions, in the order of their networks.
var labRegions = []string{"ams", "fra", "tyo"}

// labRTT is the round trip between two regions of the lab.
var labRTT = map[[2]string]time.Duration{
	{"ams", "fra"}: 30 * time.Millisecond,
	{"fra", "tyo"}: 60 * time.Millisecond,
	{"ams", "tyo"}: 80 * time.Millisecond,
}

// rttBetween is labRTT either way round; 0 within a region.
func rttBetween(a, b string) time.Duration {
	if d, ok := labRTT[[2]string{a, b}]; ok {
		return d
	}
	return labRTT[[2]string{b, a}]
}

const labNet = "10.215"

type regionLab struct {
	t       *testing.T
	id      string
	router  string // the router's namespace
	host    string // the root namespace's end of the router link
	c       *cluster
	regions []*labRegion
	relay   *proc
}

// labRegion is one region: its namespace, network, machines and gateway.
type labRegion struct {
	name     string
	ns       string
	net      string // "10.215.N"
	machines []string
	gw       *gateway
}

func (r *labRegion) addr(host int) string { return fmt.Sprintf("%s.%d", r.net, host) }

// machineAddr is the address machine i (0-based) of the region advertises.
func (r *labRegion) machineAddr(i int) string { return r.addr(i + 1) }

var delayRelayBin struct {
	once sync.Once
	path string
	err  error
}

// buildDelayRelay builds internal/netlab/cmd/delayrelay once per run.
func buildDelayRelay(t *testing.T) string {
	t.Helper()
	delayRelayBin.once.Do(func() {
		delayRelayBin.path = filepath.Join(bins.dir, "delayrelay")
		out, err := exec.Command("go", "build", "-o", delayRelayBin.path, "../internal/netlab/cmd/delayrelay").CombinedOutput()
		if err != nil {
			delayRelayBin.err = fmt.Errorf("building delayrelay: %v\n%s", err, out)
		}
	})
	if delayRelayBin.err != nil {
		t.Fatal(delayRelayBin.err)
	}
	return delayRelayBin.path
}

// newRegionNet builds the lab's network and starts its relay; it is torn
// down when the test ends, failed or not.
func newRegionNet(t *testing.T) *regionLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the multi-region lab needs root: network namespaces, veth pairs, policy routing and a TUN device")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the multi-region lab needs the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("the multi-region lab needs /dev/net/tun for its delaying relay")
	}
	relayBin := buildDelayRelay(t)
	clearDeadLabs(t)
	lab := &regionLab{t: t, id: fmt.Sprintf("%05d", os.Getpid()%100000)}
	lab.router = "eprt" + lab.id
	lab.host = "eprh" + lab.id
	t.Cleanup(lab.teardown)

	// The router and its link to the root namespace.
	run(t, "ip", "netns", "add", lab.router)
	run(t, "ip", "link", "add", lab.host, "type", "veth", "peer", "name", "up0", "netns", lab.router)
	run(t, "ip", "addr", "add", labNet+".0.1/24", "dev", lab.host)
	run(t, "ip", "link", "set", lab.host, "up")
	run(t, "ip", "route", "add", labNet+".0.0/16", "via", labNet+".0.254")
	run(t, "ip", "-n", lab.router, "addr", "add", labNet+".0.254/24", "dev", "up0")
	run(t, "ip", "-n", lab.router, "link", "set", "up0", "up")
	run(t, "ip", "-n", lab.router, "link", "set", "lo", "up")

	// The regions, each on a veth to the router.
	for i, name := range labRegions {
		r := &labRegion{name: name, ns: fmt.Sprintf("ep%s-%s", name, lab.id), net: fmt.Sprintf("%s.%d", labNet, i+1)}
		lab.regions = append(lab.regions, r)
		veth := fmt.Sprintf("r%d", i+1)
		run(t, "ip", "netns", "add", r.ns)
		run(t, "ip", "-n", lab.router, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", r.ns)
		run(t, "ip", "-n", lab.router, "addr", "add", r.addr(254)+"/24", "dev", veth)
		run(t, "ip", "-n", lab.router, "link", "set", veth, "up")
		for _, host := range []int{1, 2, 10} {
			run(t, "ip", "-n", r.ns, "addr", "add", r.addr(host)+"/24", "dev", "eth0")
		}
		run(t, "ip", "-n", r.ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", r.ns, "link", "set", "lo", "up")
		run(t, "ip", "-n", r.ns, "route", "add", "default", "via", r.addr(254))
		r.machines = []string{name + "-1", name + "-2"}
	}

	// The relay creates dly0 in the router; then the routes into it.
	var links []string
	for pair, rtt := range labRTT {
		links = append(links, "--link", fmt.Sprintf("%s.0/24,%s.0/24=%s", lab.region(pair[0]).net, lab.region(pair[1]).net, rtt))
	}
	lab.relay = start(t, "delayrelay", nil, "ip", append([]string{"netns", "exec", lab.router, relayBin, "--tun", "dly0"}, links...)...)
	lab.relay.waitOutput(t, `delayrelay ready`, 10*time.Second)
	run(t, "ip", "-n", lab.router, "link", "set", "dly0", "up")
	run(t, "ip", "netns", "exec", lab.router, "sysctl", "-qw", "net.ipv4.ip_forward=1",
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.dly0.rp_filter=0")
	run(t, "ip", "-n", lab.router, "route", "add", "default", "dev", "dly0", "table", "100")
	for i, from := range lab.regions {
		for _, to := range lab.regions {
			if to != from {
				run(t, "ip", "-n", lab.router, "rule", "add", "iif", fmt.Sprintf("r%d", i+1),
					"from", from.net+".0/24", "to", to.net+".0/24", "table", "100")
			}
		}
	}

	return lab
}

// newRegionLab is newRegionNet with the control server, two agents per
// region and each region's gateway (gwApp: extra fields of the gateways'
// edgeplane app) on it.
func newRegionLab(t *testing.T, gwApp map[string]any) *regionLab {
	t.Helper()
	lab := newRegionNet(t)
	buildExtra(t)
	// The control plane, reached from every region through the router
	// with no delay; beyond loopback it runs with credentials and TLS.
	lab.c = &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}}
	lab.c.startServer(labNet + ".0.1:0")
	t.Cleanup(lab.c.killInstances)
	for _, r := range lab.regions {
		for i, m := range r.machines {
			lab.joinMachine(r, m, r.machineAddr(i))
		}
	}
	for _, r := range lab.regions {
		r.gw = lab.startGateway(r, gwApp)
	}
	return lab
}

func (l *regionLab) region(name string) *labRegion {
	for _, r := range l.regions {
		if r.name == name {
			return r
		}
	}
	l.t.Fatalf("the lab has no region %q", name)
	return nil
}

// joinMachine starts machine id's agent in r's namespace, invited into r
// at addr, its instances listening on addr.
func (l *regionLab) joinMachine(r *labRegion, id, addr string) {
	t := l.t
	t.Helper()
	token := strings.TrimSpace(l.c.mustControl("machine", "invite", "--region", r.name, "--address", addr))
	p := start(t, "agent "+id, l.c.natsEnv(storagenode.RoleAgent, id), "ip",
		"netns", "exec", r.ns, bins.control, "agent", "--data", l.c.agentDir(id), "--join", token, "--machine", id,
		"--advertise", addr, "--stop-grace", "2s")
	p.waitOutput(t, `agent serving`, 20*time.Second)
	l.c.agents[id] = p
}

// startGateway starts r's gateway in its namespace at r.addr(10): the
// shipped edgeplane handler on :80, DNS on :53, admin on :2019. Its
// gateway_name is the region's first machine, whose region it serves.
func (l *regionLab) startGateway(r *labRegion, gwApp map[string]any) *gateway {
	t := l.t
	t.Helper()
	name := r.machines[0]
	g := &gateway{http: r.addr(10) + ":80", admin: r.addr(10) + ":2019", dns: r.addr(10) + ":53", dir: filepath.Join(l.c.dir, "gw-"+r.name)}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	app := map[string]any{
		"nats_url": l.c.url, "creds_file": l.c.issueCreds(storagenode.RoleGateway, name), "gateway_name": name,
		"snapshot_path": filepath.Join(g.dir, "routing.json"), "traffic_interval": "1s",
	}
	for k, v := range gwApp {
		app[k] = v
	}
	cfg := map[string]any{
		"admin": map[string]any{"listen": g.admin},
		"apps": map[string]any{
			"edgeplane": app,
			// The dns app takes the gateway's region (its machine's) and
			// fails over in the order the gateway measured.
			"edgeplane_dns": map[string]any{"listen": []string{g.dns}, "ttl": "1s"},
			"http": map[string]any{"http_port": 80, "servers": map[string]any{"gw": map[string]any{
				"listen":          []string{g.http},
				"automatic_https": map[string]any{"disable": true},
				"routes":          []any{map[string]any{"handle": []any{shippedHandler(t)}}},
			}}},
		},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	path := filepath.Join(g.dir, "caddy.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + g.dir, "XDG_DATA_HOME=" + filepath.Join(g.dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(g.dir, "config")}
	g.proc = start(t, "caddy "+r.name, env, "ip", "netns", "exec", r.ns, extraBins.caddy, "run", "--config", path)
	g.waitConnected(t, r.name)
	return g
}

// teardown removes the lab's namespaces (their links and the TUN device
// go with them) and the root namespace's end of the router link; the
// processes are stopped by their own cleanups, which run first.
// clearDeadLabs removes what a lab whose test process was killed left
// behind (its teardown never ran): its namespaces, its router's veth, and
// the route to the lab's net, which would otherwise send this lab's
// traffic to a router that is gone. A lab whose process still runs is
// left alone; two cannot share the net anyway.
func clearDeadLabs(t *testing.T) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	var dead []string
	for _, line := range strings.Split(string(out), "\n") {
		ns, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		id, ok := strings.CutPrefix(ns, "eprt")
		if !ok || id == "" {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimLeft(id, "0"))
		if err == nil && pid != os.Getpid()%100000 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				t.Fatalf("another region lab (namespace %s) runs: one lab at a time", ns)
			}
		}
		dead = append(dead, id)
	}
	for _, id := range dead {
		t.Logf("removing the leftovers of a region lab that was killed (%s)", id)
		for _, name := range labRegions {
			_ = exec.Command("ip", "netns", "del", fmt.Sprintf("ep%s-%s", name, id)).Run()
		}
		_ = exec.Command("ip", "netns", "del", "eprt"+id).Run()
		_ = exec.Command("ip", "link", "del", "eprh"+id).Run()
	}
	if len(dead) > 0 {
		_ = exec.Command("ip", "route", "del", labNet+".0.0/16").Run()
	}
}

func (l *regionLab) teardown() {
	for _, r := range l.regions {
		_ = exec.Command("ip", "netns", "del", r.ns).Run()
	}
	_ = exec.Command("ip", "netns", "del", l.router).Run()
	_ = exec.Command("ip", "link", "del", l.host).Run()
	_ = exec.Command("ip", "route", "del", labNet+".0.0/16").Run()
}

// inNetns runs f on an OS thread in namespace ns; the thread is thrown
// away afterwards (it stays locked), so no other goroutine inherits it.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening namespace %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// connectTime is the median TCP connect time from region from (its first
// machine's address) to addr, over n connections: one round trip.
func (l *regionLab) connectTime(from *labRegion, addr string, n int) (time.Duration, error) {
	var times []time.Duration
	err := inNetns(from.ns, func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from.machineAddr(0))}, Timeout: 2 * time.Second}
		for i := 0; i < n; i++ {
			begin := time.Now()
			conn, err := d.Dial("tcp", addr)
			if err != nil {
				return err
			}
			times = append(times, time.Since(begin))
			conn.Close()
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return median(times), nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// freeze stops (SIGSTOP) or resumes (SIGCONT) region r's machines: their
// agents and every instance they started.
func (l *regionLab) freeze(r *labRegion, sig syscall.Signal) {
	for _, m := range r.machines {
		l.c.agents[m].signal(sig)
		for _, pid := range recordedPIDs(filepath.Join(l.c.agentDir(m), "instances", "*.json")) {
			_ = syscall.Kill(-pid, sig)
		}
	}
}

// instanceRegions maps each ready instance of namespace ns to its region.
func (l *regionLab) instanceRegions(ns string) map[string]string {
	out := map[string]string{}
	for _, in := range l.c.instances(ns) {
		if in.State != store.InstanceReady {
			continue
		}
		for _, r := range l.regions {
			for _, m := range r.machines {
				if m == in.Machine {
					out[in.ID] = r.name
				}
			}
		}
	}
	return out
}

// digIn runs dig from region r's namespace against its gateway's DNS.
func (l *regionLab) digIn(r *labRegion, qtype, name string) []string {
	l.t.Helper()
	host, port, _ := net.SplitHostPort(r.gw.dns)
	out, err := exec.Command("ip", "netns", "exec", r.ns, "dig", "+short", "+tries=1", "+time=2", "@"+host, "-p", port, name, qtype).CombinedOutput()
	if err != nil {
		l.t.Fatalf("dig %s %s in %s: %v\n%s", name, qtype, r.name, err, out)
	}
	var lines []string
	for _, s := range strings.Split(string(bytes.TrimSpace(out)), "\n") {
		if s != "" {
			lines = append(lines, s)
		}
	}
	return lines
}
