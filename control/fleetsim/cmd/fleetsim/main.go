// Command fleetsim runs a simulated fleet against a running control plane:
// N machines whose agents answer the real RPCs, write real instance
// records, heartbeats and machine state, and run nothing. Without --rate it
// keeps them running until Ctrl-C, so that `control machine ls`, `control
// status` and `control deploy apply` can be tried at fleet size on one box.
// With --rate it runs a load (the fleet load figures of BENCHMARKS.md) and reports: instance
// state writes at that rate for --duration, with --gateways routing
// projections following and --applies deploys measured to every one of
// them.
//
// It writes machine records, so its own connection needs control
// credentials (or none, on a loopback box without authentication). With
// --auth-dir (the storage node's, holding the account keys) every
// simulated agent and gateway connects on its own with credentials of its
// role issued for it alone; without, they share one connection.
//
//	go run ./control/fleetsim/cmd/fleetsim --machines 1000
//	go run ./control/fleetsim/cmd/fleetsim --auth-dir DATA/auth --machines 10000 \
//	    --namespaces 1000 --rate 10000 --duration 60s --gateways 100 --watch server=PID
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	var cfg store.Config
	cfg.AddFlags(fs)
	n := fs.Int("machines", 100, "how many machines to simulate")
	prefix := fs.String("prefix", "sim", "machine IDs are PREFIX plus a five-digit number")
	capacity := fs.Int("capacity", 256, "instances each machine accepts")
	beat := fs.Duration("heartbeat", store.DefaultBeatInterval, "heartbeat interval of every simulated agent")
	authDir := fs.String("auth-dir", "", "a storage node's auth dir: issue each simulated agent and gateway its own credentials from it")
	namespaces := fs.Int("namespaces", 1000, "with --rate: deployments placed on the fleet")
	perNS := fs.Int("per-namespace", 10, "with --rate: instances of each deployment")
	rate := fs.Int("rate", 0, "run a load: instance state changes per second (0: no load, run until Ctrl-C)")
	burst := fs.Int("burst", 1, "with --rate: change up to this many instances of one machine at a time, as an apply does (its agent writes what meets in one write)")
	duration := fs.Duration("duration", time.Minute, "with --rate: how long the writes go on")
	gateways := fs.Int("gateways", 0, "with --rate: simulated gateways (routing projections)")
	applies := fs.Int("applies", 5, "with --rate and --gateways: applies measured to every gateway, before and during the writes")
	signingKey := fs.String("signing-key", os.Getenv("EDGEPLANE_SIGNING_KEY"), "with --applies: signer key `FILE` the applies sign their intent with (control server writes DATA/signer.nk)")
	midwayKill := fs.Int("midway-kill", 0, "with --rate: kill this process (a storage node) with SIGKILL halfway through the writes")
	midwayKillLeader := fs.String("midway-kill-leader", "", "with --rate: `NAME=PID,...` storage nodes by server name; halfway through the writes, kill (SIGKILL) the one leading the instances bucket, which the writes go to")
	watch := fs.String("watch", "", "with --rate: `NAME=PID,...` processes (control server, storage nodes) whose CPU during the writes and memory after the run are reported, and their CPU and memory per agent while the agents connect")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *n <= 0 {
		fmt.Fprintln(os.Stderr, "fleetsim: --machines must be positive")
		return 2
	}
	if err := fleetsim.RaiseFileLimit(uint64(*n+*gateways) + 1024); err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	s, err := cfg.DialForWrites(dctx, store.ConnectOptions{Name: "fleetsim", ReconnectForever: true})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	defer s.NC.Close()
	if *signingKey != "" {
		k, err := signing.OpenKeyFile(*signingKey)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
			return 1
		}
		s.SignWith(k)
	}
	dialer, err := newDialer(s, *authDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	if dialer.Dir != "" {
		defer os.RemoveAll(dialer.Dir)
	}

	if *rate > 0 {
		spec := fleetsim.LoadSpec{Machines: *n, Namespaces: *namespaces, PerNamespace: *perNS,
			Rate: *rate, Burst: *burst, Duration: *duration, Gateways: *gateways, Applies: *applies, Beat: *beat, Dialer: dialer, Log: os.Stdout}
		if pid := *midwayKill; pid > 0 {
			spec.Midway = func() string {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					return fmt.Sprintf("killing pid %d: %v", pid, err)
				}
				return fmt.Sprintf("killed pid %d (SIGKILL)", pid)
			}
		}
		if *midwayKillLeader != "" {
			nodes, err := parseWatch(*midwayKillLeader)
			if err != nil {
				fmt.Fprintf(os.Stderr, "fleetsim: --midway-kill-leader: %v\n", err)
				return 2
			}
			spec.Midway = func() string { return killLeader(ctx, s, nodes) }
		}
		procs, err := parseWatch(*watch)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
			return 2
		}
		procs = append(procs, &proc{name: "fleetsim", pid: os.Getpid()})
		spec.OnChurn = func(started bool) {
			for _, p := range procs {
				p.mark(started)
			}
		}
		spec.OnAgents = func(started bool) {
			for _, p := range procs {
				p.markAdmission(started)
			}
			if !started {
				// Said at once: a run that fails later still reports it.
				for _, p := range procs {
					fmt.Println(p.admission(*n))
				}
			}
		}
		rep, err := fleetsim.RunLoad(ctx, s, spec)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
			return 1
		}
		fmt.Println(rep.Summary())
		for _, p := range procs {
			fmt.Println(p.report(rep.Churn.Writes))
		}
		if rep.Lost != nil || rep.SummaryErr != nil || rep.Unseen > 0 {
			return 1
		}
		return 0
	}

	start := time.Now()
	sc := fleetsim.Config{Machines: *n, Prefix: *prefix, Capacity: *capacity, Beat: *beat}
	if *authDir != "" {
		sc.Dial = dialer.Agent
	}
	f, err := fleetsim.Start(ctx, s, sc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetsim: %v\n", err)
		return 1
	}
	defer f.Stop()
	fmt.Printf("%d simulated machines (%s00000..) answering, beating every %s; started in %s; Ctrl-C stops them\n",
		*n, *prefix, *beat, time.Since(start).Round(time.Millisecond))
	<-ctx.Done()
	fmt.Printf("stopping; %d simulated instances were running\n", f.Instances())
	return 0
}

// newDialer returns what opens the simulated agents' and gateways'
// connections: with authDir, each its own with credentials issued for it;
// without, each its own without credentials.
func newDialer(s *store.Store, authDir string) (*fleetsim.Dialer, error) {
	d := &fleetsim.Dialer{URLs: s.NC.ConnectedUrl(), Names: s.Names}
	if servers := s.NC.Servers(); len(servers) > 0 {
		d.URLs = strings.Join(servers, ",")
	}
	if authDir == "" {
		return d, nil
	}
	auth, err := storagenode.LoadAuth(authDir, false)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", authDir, err)
	}
	dir, err := os.MkdirTemp("", "fleetsim-creds-")
	if err != nil {
		return nil, err
	}
	d.Auth, d.Dir = auth, dir
	return d, nil
}

// proc is a process whose resources a load run reports.
type proc struct {
	name       string
	pid        int
	cpu0, cpu1 time.Duration
	t0, t1     time.Time
	// The admission phase (the agents connecting and reporting in): CPU
	// time and resident memory at its start and end.
	admCPU0, admCPU1 time.Duration
	admT0, admT1     time.Time
	admRSS0, admRSS1 int64
}

func parseWatch(list string) ([]*proc, error) {
	var out []*proc
	for _, item := range strings.Split(list, ",") {
		if item == "" {
			continue
		}
		name, pidStr, ok := strings.Cut(item, "=")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			return nil, fmt.Errorf("--watch %q: want NAME=PID", item)
		}
		out = append(out, &proc{name: name, pid: pid})
	}
	return out, nil
}

// mark notes the process's CPU time at the start or end of the writes.
func (p *proc) mark(start bool) {
	cpu, _ := cpuTime(p.pid)
	if start {
		p.cpu0, p.t0 = cpu, time.Now()
	} else {
		p.cpu1, p.t1 = cpu, time.Now()
	}
}

// markAdmission notes the process's CPU time and resident memory at the
// start or end of the agents' admission.
func (p *proc) markAdmission(start bool) {
	cpu, _ := cpuTime(p.pid)
	rss := residentBytes(p.pid)
	if start {
		p.admCPU0, p.admT0, p.admRSS0 = cpu, time.Now(), rss
	} else {
		p.admCPU1, p.admT1, p.admRSS1 = cpu, time.Now(), rss
	}
}

// admission says what admitting n agents cost the process: its CPU time
// per agent, and its resident memory per agent (what it grew by) and in
// all.
func (p *proc) admission(n int) string {
	if !p.admT1.After(p.admT0) || n <= 0 {
		return fmt.Sprintf("%s (pid %d): admission not measured", p.name, p.pid)
	}
	cpu := p.admCPU1 - p.admCPU0
	return fmt.Sprintf("%s (pid %d): admitting %d agents in %s took %.2fs of CPU (%.0f%% of one core), %.0f µs per agent; RSS %d MB before, %d MB after: %.1f KB more per agent",
		p.name, p.pid, n, p.admT1.Sub(p.admT0).Round(time.Millisecond), cpu.Seconds(), 100*float64(cpu)/float64(p.admT1.Sub(p.admT0)),
		float64(cpu.Microseconds())/float64(n), p.admRSS0>>20, p.admRSS1>>20, float64(p.admRSS1-p.admRSS0)/1024/float64(n))
}

// report says the process's CPU during the writes, and per acknowledged
// change (of changes): the figure the storage node's goal is set in.
func (p *proc) report(changes int) string {
	out := fmt.Sprintf("%s (pid %d):", p.name, p.pid)
	if p.t1.After(p.t0) && p.cpu1 > 0 {
		out += fmt.Sprintf(" CPU during the writes %.0f%% (of one core),", 100*float64(p.cpu1-p.cpu0)/float64(p.t1.Sub(p.t0)))
		if changes > 0 {
			out += fmt.Sprintf(" %.0f µs per acknowledged change,", float64((p.cpu1-p.cpu0).Microseconds())/float64(changes))
		}
	}
	return out + " " + memoryOf(p.pid)
}

// cpuTime is the user and system time a process has used, from
// /proc/PID/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; fields are counted after it.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// memoryOf reads a process's resident memory now and at its peak.
func memoryOf(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "VmRSS" || k == "VmHWM") {
			out = append(out, k+" "+strings.Join(strings.Fields(v), " "))
		}
	}
	return strings.Join(out, ", ")
}

// residentBytes is a process's resident memory now (VmRSS), 0 when it
// cannot be read.
func residentBytes(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// killLeader kills (SIGKILL) the node of nodes that leads the instances
// bucket and says which it was.
func killLeader(ctx context.Context, s *store.Store, nodes []*proc) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream := "KV_" + s.Names.InstancesBucket()
	info, err := s.StreamInfo(ctx, stream)
	if err != nil {
		return fmt.Sprintf("finding the leader of %s: %v", stream, err)
	}
	ci := info.Cluster
	if ci == nil || ci.Leader == "" {
		return fmt.Sprintf("%s has no leader to kill", stream)
	}
	for _, n := range nodes {
		if n.name == ci.Leader {
			if err := syscall.Kill(n.pid, syscall.SIGKILL); err != nil {
				return fmt.Sprintf("killing %s (pid %d): %v", n.name, n.pid, err)
			}
			return fmt.Sprintf("killed %s (pid %d, SIGKILL), the leader of %s", n.name, n.pid, stream)
		}
	}
	return fmt.Sprintf("the leader of %s, %s, is not one of the nodes given", stream, ci.Leader)
}
