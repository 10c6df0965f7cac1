package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/agentproc"
	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/store"
)

func setupAgent(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "agent data dir: identity, instance state and logs (required)")
	join := fs.String("join", "", "invite `TOKEN` from 'control machine invite'; needed once")
	joinOnly := fs.Bool("join-only", false, "with --join: redeem the invite, save the identity (and enrolled credentials) in --data and exit, for a service that starts the agent later")
	machine := fs.String("machine", "", "machine ID (default: the hostname)")
	advertise := fs.String("advertise", "", "IP instances listen on and are reached at (default: the saved one, else this machine's mesh IP, else 127.0.0.1)")
	var cfg agent.Config
	var engine, metricsListen string
	fs.IntVar(&cfg.MaxInstances, "max-instances", 256, "instances this machine accepts")
	fs.DurationVar(&cfg.StopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace when stopping instances")
	fs.DurationVar(&cfg.RestartBackoff, "restart-backoff", time.Second, "first wait before restarting an instance that ended on its own; doubled per failure in a row")
	fs.DurationVar(&cfg.RestartBackoffMax, "restart-backoff-max", 5*time.Minute, "longest wait between restarts")
	fs.StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus metrics (edgeplane_agent_*) on this address's /metrics; empty: off")
	fs.DurationVar(&cfg.BeatInterval, "heartbeat", store.DefaultBeatInterval, "how often the agent writes this machine's heartbeat (stale after 3 missed, offline after 10)")
	fs.StringVar(&engine, "engine", "", "container engine socket for services with an image, e.g. unix:///run/podman/podman.sock (default: Docker's socket, then podman's, if one answers; none: no containers)")
	fs.StringVar((*string)(&cfg.GatewayReleases), "gateway-releases", "", "dir this machine's gateway binaries are staged in for fleet upgrades, owned by root and writable by no other user (as every dir above it); the gateway runs as `caddy supervise --binary DIR/current` (packaged: /var/lib/edgeplane/releases/gateway)")
	fs.StringVar(&cfg.GatewayUnit, "gateway-unit", "", "the gateway's systemd unit, if it runs under systemd: its MainPID is told to swap, not the pidfile's (packaged: edgeplane-gateway.service)")
	fs.StringVar(&cfg.GatewayPidfile, "gateway-pidfile", "", "pidfile of this machine's `caddy supervise`, told to swap the gateway when a release carries caddy (packaged: /run/edgeplane-gateway/supervise.pid)")
	fs.StringVar((*string)(&cfg.MeshdReleases), "meshd-releases", "", "meshd's release dir for fleet upgrades (`meshd run --releases`), owned by root and writable by no other user (as every dir above it) (packaged: /var/lib/edgeplane/releases/meshd)")
	fs.StringVar(&cfg.MeshdUnit, "meshd-unit", "", "meshd's systemd unit, if it runs under systemd: its MainPID is restarted, not the pidfile's (packaged: edgeplane-meshd.service)")
	fs.StringVar(&cfg.MeshdPidfile, "meshd-pidfile", "", "pidfile of this machine's `meshd run --pidfile`, restarted onto a release that carries meshd (packaged: /run/edgeplane-meshd/meshd.pid)")
	enrollAt := fs.String("enroll", "", "with --join and no --creds: storage nodes' enrollment addresses host:port, comma-separated (default: the --nats hosts, port 4223)")
	lf := addLogFlags(fs)
	return func(c *call) error {
		if *data == "" {
			return usagef("--data is required")
		}
		if *joinOnly && *join == "" {
			return usagef("--join-only needs --join TOKEN")
		}
		cfg.DataDir = *data
		if !*joinOnly {
			if err := agentproc.Launch(&cfg); err != nil {
				return err
			}
		}
		logger, err := lf.logger(c)
		if err != nil {
			return err
		}
		defer func() { _ = logger.Sync() }()
		if c.client.CredsFile == "" {
			creds, err := enroll.AgentCreds(c.ctx, enroll.JoinRequest{Token: *join, Machine: *machine, Addrs: splitList(*enrollAt), Dir: *data}, c.client.NATSURL, c.stdout)
			if err != nil {
				return err
			}
			c.client.CredsFile = creds
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
			cfg.Store, cfg.Machine, cfg.Logger = s, *rec, logger
			return agentproc.Run(c.ctx, cfg, engine, metricsListen)
		})
		if re, ok := agent.IsRestart(err); ok {
			logger.Info("agent restarting", zap.String("binary", re.Path), zap.String("reason", re.Reason))
			_ = logger.Sync()
			return agentproc.Exec(re.Path, false)
		}
		return err
	}
}
