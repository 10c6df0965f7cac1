package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/metricsserver"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func setupAgent(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "agent data dir: identity, instance state and logs (required)")
	join := fs.String("join", "", "invite `TOKEN` from 'control machine invite'; needed once")
	joinOnly := fs.Bool("join-only", false, "with --join: redeem the invite, save the identity (and enrolled credentials) in --data and exit, for a service that starts the agent later")
	machine := fs.String("machine", "", "machine ID (default: the hostname)")
	advertise := fs.String("advertise", "", "IP instances listen on and are reached at (default: the saved one, else this machine's mesh IP, else 127.0.0.1)")
	o := agentOptions{}
	fs.IntVar(&o.maxInstances, "max-instances", 256, "instances this machine accepts")
	fs.DurationVar(&o.stopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace when stopping instances")
	fs.DurationVar(&o.restartBackoff, "restart-backoff", time.Second, "first wait before restarting an instance that ended on its own; doubled per failure in a row")
	fs.DurationVar(&o.restartBackoffMax, "restart-backoff-max", 5*time.Minute, "longest wait between restarts")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "serve Prometheus metrics (edgeplane_agent_*) on this address's /metrics; empty: off")
	fs.DurationVar(&o.beat, "heartbeat", store.DefaultBeatInterval, "how often the agent writes this machine's heartbeat (stale after 3 missed, offline after 10)")
	fs.StringVar(&o.engine, "engine", "", "container engine socket for services with an image, e.g. unix:///run/podman/podman.sock (default: Docker's socket, then podman's, if one answers; none: no containers)")
	gwReleases := fs.String("gateway-releases", "", "dir this machine's gateway binaries are staged in for fleet upgrades, owned by root and writable by no other user (as every dir above it); the gateway runs as `caddy supervise --binary DIR/current` (packaged: /var/lib/edgeplane/releases/gateway)")
	fs.StringVar(&o.gatewayUnit, "gateway-unit", "", "the gateway's systemd unit, if it runs under systemd: its MainPID is told to swap, not the pidfile's (packaged: edgeplane-gateway.service)")
	fs.StringVar(&o.gatewayPidfile, "gateway-pidfile", "", "pidfile of this machine's `caddy supervise`, told to swap the gateway when a release carries caddy (packaged: /run/edgeplane-gateway/supervise.pid)")
	meshdReleases := fs.String("meshd-releases", "", "meshd's release dir for fleet upgrades (`meshd run --releases`), owned by root and writable by no other user (as every dir above it) (packaged: /var/lib/edgeplane/releases/meshd)")
	fs.StringVar(&o.meshdUnit, "meshd-unit", "", "meshd's systemd unit, if it runs under systemd: its MainPID is restarted, not the pidfile's (packaged: edgeplane-meshd.service)")
	fs.StringVar(&o.meshdPidfile, "meshd-pidfile", "", "pidfile of this machine's `meshd run --pidfile`, restarted onto a release that carries meshd (packaged: /run/edgeplane-meshd/meshd.pid)")
	enrollAt := fs.String("enroll", "", "with --join and no --creds: storage nodes' enrollment addresses host:port, comma-separated (default: the --nats hosts, port 4223)")
	lf := addLogFlags(fs)
	return func(c *call) error {
		if *data == "" {
			return usagef("--data is required")
		}
		if *joinOnly && *join == "" {
			return usagef("--join-only needs --join TOKEN")
		}
		// Which binary runs this agent: the release the machine upgraded
		// to, or the previous one after a failed trial (internal/upgrade).
		releases, self, trial := upgrade.Dir(""), "", (*upgrade.Trial)(nil)
		if !*joinOnly {
			var next string
			var err error
			releases = upgrade.ForData(*data)
			if self, err = ownBinary(); err != nil {
				return err
			}
			launched := os.Getenv(upgrade.LaunchedEnv) != ""
			os.Unsetenv(upgrade.LaunchedEnv)
			if next, trial, err = releases.Launch(self, launched); err != nil {
				return fmt.Errorf("agent releases: %w", err)
			}
			if next != "" {
				return execAgent(next, true)
			}
			// A test build can make one release fail at start.
			failpoint.Hit("agent_start@" + version.Version)
		}
		logger, err := lf.logger(c)
		if err != nil {
			return err
		}
		defer func() { _ = logger.Sync() }()
		if err := enrollBox(c, *join, *machine, *data, *enrollAt); err != nil {
			return err
		}
		err = c.withStore(func(s *store.Store) error {
			rec, err := agent.Identify(c.ctx, s, agent.JoinRequest{DataDir: *data, Token: *join, Machine: *machine, Advertise: *advertise})
			if errors.Is(err, agent.ErrBadAdvertise) {
				return usagef("--advertise %q is not an IP address", *advertise)
			}
			if err != nil {
				return err
			}
			if *joinOnly {
				fmt.Fprintf(c.stdout, "machine %s (%s) joined; its identity is in %s\n", rec.ID, rec.Address, *data)
				return nil
			}
			fmt.Fprintf(c.stdout, "agent for machine %s (%s) serving; instances survive this process\n", rec.ID, rec.Address)
			o.dir = *data
			// The CA bundle storage nodes are verified against follows the
			// fleet's, so a CA rotation reaches this box, and its
			// credentials are renewed before they expire.
			fctx, stopFollow := context.WithCancel(c.ctx)
			followed := make(chan struct{})
			go func() {
				defer close(followed)
				c.client.Follow(fctx, s, func(err error) { logger.Warn("following the fleet's CA bundle and credentials", zap.Error(err)) })
			}()
			defer func() {
				stopFollow()
				<-followed
			}()
			o.releases, o.self, o.trial, o.gatewayReleases = releases, self, trial, upgrade.Dir(*gwReleases)
			o.meshdReleases = upgrade.Dir(*meshdReleases)
			return runAgent(c.ctx, s, rec, o, logger)
		})
		if re, ok := agent.IsRestart(err); ok {
			logger.Info("agent restarting", zap.String("binary", re.Path), zap.String("reason", re.Reason))
			_ = logger.Sync()
			return execAgent(re.Path, false)
		}
		return err
	}
}

// ownBinary is this process's binary, symlinks resolved.
func ownBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	return filepath.EvalSymlinks(self)
}

// execAgent goes on as the agent binary path, in this process (same PID:
// a supervisor sees no exit, instances keep their parent), with this
// process's arguments except an invite, which is good once. launched
// marks an exec by Launch (upgrade.LaunchedEnv).
func execAgent(path string, launched bool) error {
	args := []string{path}
	for i := 1; i < len(os.Args); i++ {
		a := os.Args[i]
		switch {
		case a == "--join" || a == "-join":
			i++
			continue
		case strings.HasPrefix(a, "--join=") || strings.HasPrefix(a, "-join="):
			continue
		}
		args = append(args, a)
	}
	env := os.Environ()
	if launched {
		env = append(env, upgrade.LaunchedEnv+"=1")
	}
	if err := syscall.Exec(path, args, env); err != nil {
		return fmt.Errorf("restarting the agent as %s: %w", path, err)
	}
	return nil
}

// agentOptions are an agent's settings from its command line.
type agentOptions struct {
	dir                               string
	maxInstances                      int
	stopGrace                         time.Duration
	restartBackoff, restartBackoffMax time.Duration
	metricsListen                     string
	engine                            string
	beat                              time.Duration
	releases                          upgrade.Dir
	self                              string
	trial                             *upgrade.Trial
	gatewayReleases                   upgrade.Dir
	gatewayPidfile                    string
	meshdReleases                     upgrade.Dir
	meshdPidfile                      string
	gatewayUnit, meshdUnit            string
}

func runAgent(ctx context.Context, s *store.Store, rec *store.MachineRecord, o agentOptions, logger *zap.Logger) error {
	s.SetLogger(logger)
	ctr, err := agent.ConnectEngine(ctx, o.engine, logger)
	if err != nil {
		return err
	}
	if ctr != nil {
		defer ctr.Close()
	}
	a, err := agent.New(agent.Config{
		Store: s, Machine: *rec, DataDir: o.dir, Driver: &runtime.Process{}, Containers: ctr,
		Logger: logger, MaxInstances: o.maxInstances, StopGrace: o.stopGrace,
		RestartBackoff: o.restartBackoff, RestartBackoffMax: o.restartBackoffMax, BeatInterval: o.beat,
		Releases: o.releases, Self: o.self, Trial: o.trial,
		GatewayReleases: o.gatewayReleases, GatewayPidfile: o.gatewayPidfile,
		MeshdReleases: o.meshdReleases, MeshdPidfile: o.meshdPidfile,
		GatewayUnit: o.gatewayUnit, MeshdUnit: o.meshdUnit,
	})
	if err != nil {
		return err
	}
	if o.metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(a.Collector())
		stop, err := metricsserver.Serve(ctx, o.metricsListen, reg)
		if err != nil {
			return err
		}
		defer stop()
		logger.Info("agent metrics", zap.String("listen", o.metricsListen))
	}
	return a.Run(ctx)
}

// enrollBox, for an invite that names the fleet's CAs and a box with no
// credentials yet, enrolls it: its keys are made here, and DIR gets one
// credentials file per role (agent, mesh, gateway), the agent's used from
// now on. Later starts find DIR/agent.creds and use it.
func enrollBox(c *call, token, machine, dir, addrs string) error {
	saved := enroll.CredsFile(dir, storagenode.RoleAgent)
	if c.client.CredsFile == "" {
		if _, err := os.Stat(saved); err == nil {
			c.client.CredsFile = saved
			return nil
		}
	}
	cas, err := invites.CAs(token)
	if err != nil || token == "" || len(cas) == 0 || c.client.CredsFile != "" {
		return err
	}
	list := splitList(addrs)
	if len(list) == 0 {
		for _, u := range strings.Split(c.client.NATSURL, ",") {
			if pu, err := url.Parse(strings.TrimSpace(u)); err == nil && pu.Hostname() != "" {
				list = append(list, net.JoinHostPort(pu.Hostname(), strconv.Itoa(enroll.DefaultPort)))
			}
		}
	}
	if machine == "" {
		machine = store.DefaultMachineID()
	}
	files, err := enroll.Join(c.ctx, enroll.JoinRequest{Token: token, Machine: machine, Addrs: list, Dir: dir})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "enrolled machine %s: credentials (keys made on this box) in %s, %s and %s\n", machine,
		files[storagenode.RoleAgent], files[storagenode.RoleMesh], files[storagenode.RoleGateway])
	c.client.CredsFile = files[storagenode.RoleAgent]
	return nil
}
