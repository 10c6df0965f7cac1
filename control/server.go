package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/control/agentproc"
	"github.com/edgeplane/edgeplane/control/controlplane"
	"github.com/edgeplane/edgeplane/control/dashboard"
	"github.com/edgeplane/edgeplane/control/enroll"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func setupServer(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "data dir: the JetStream store and, with --agent, the local agent (required)")
	listen := fs.String("listen", storagenode.DefaultListen, "client address of the embedded NATS server")
	external := fs.String("nats", "", "use this external NATS (cluster) URL instead of the embedded server")
	creds := fs.String("creds", "", "credentials file for --nats")
	caFile := fs.String("tls-ca", "", "with --nats: PEM file of the CAs the storage nodes are verified against (default: the one --creds carries)")
	inst := fs.String("installation", store.DefaultInstallation, "installation scope of every name")
	auth := fs.String("authority", store.DefaultAuthority, "authority scope of every name")
	withAgent := fs.Bool("agent", false, "also run this box's agent, recording it as a machine")
	machine := fs.String("machine", "", "with --agent: machine ID (default: the hostname)")
	advertise := fs.String("advertise", "127.0.0.1", "with --agent: IP instances listen on and are reached at")
	natsLogs := fs.Bool("nats-logs", false, "log the embedded NATS server's own lines too")
	stunListen := fs.String("stun-listen", "127.0.0.1:3478,127.0.0.1:3479", "STUN server addresses for meshd NAT discovery (two ports let nodes classify their NAT); empty disables")
	stunAdvertise := fs.String("stun-advertise", "", "STUN addresses meshd nodes are told to use (default: --stun-listen; required when listening on 0.0.0.0)")
	meshRelay := fs.String("mesh-relay", "", "run a mesh relay (TURN) on this UDP address, for meshd nodes with no direct path to each other; empty: none")
	meshRelayIP := fs.String("mesh-relay-ip", "", "with --mesh-relay: the address nodes reach the relay and its relayed ports at (default: --mesh-relay's IP; required when that is 0.0.0.0)")
	meshRelays := fs.String("mesh-relays", "", "relays (host:port) meshd nodes are told to use, comma-separated, the same on every control server (default: this server's --mesh-relay)")
	meshCooldown := fs.Duration("mesh-ip-cooldown", registrar.DefaultCooldown, "how long a released mesh IP stays out of the pool")
	meshSubnet := fs.String("mesh-subnet", store.MeshSubnet, "subnet mesh IPs are allocated from")
	metrics := fs.String("metrics-listen", "", "serve Prometheus metrics (edgeplane_fleet_*) on this address's /metrics; empty: off")
	dashListen := fs.String("dashboard-listen", "", "serve the read-only web dashboard on this address (e.g. 127.0.0.1:8090); empty: off")
	dashLogin := fs.Bool("dashboard-login", false, "ask for a login token (control dashboard token) even on loopback; off loopback it is always asked for")
	dashChartStep := fs.Duration("dashboard-chart-step", dashboard.DefaultChartStep, "how much time a point of the dashboard's traffic charts stands for (they show the last hour)")
	enrollListen := fs.String("enroll-listen", "", "with TLS, answer invited boxes' enrollments (HTTPS) on this address (default: --listen's host, port 4223, when that is not loopback); off: none")
	credsTTL := fs.Duration("creds-ttl", storagenode.DefaultCredsTTL, "how long the credentials of boxes (agent, mesh, gateway) this server signs last, at enrollment and at each renewal; a running box renews its own at two thirds of it, a box offline longer must be invited again")
	statusFlush := fs.Duration("status-flush", fleet.DefaultFlushEvery, "how often changed namespaces' fleet status is written (control status lags by up to this much), and the machines' liveness judgement gateways set aside by is looked at; 0: this server writes neither (another control server does)")
	cf := addClusterFlags(fs)
	lf := addLogFlags(fs)
	return func(c *call) (err error) {
		if *data == "" {
			return usagef("--data is required")
		}
		if *credsTTL < 10*time.Second {
			return usagef("--creds-ttl %s: at least 10s", *credsTTL)
		}
		names, err := store.NewNames(*inst, *auth)
		if err != nil {
			return usagef("%v", err)
		}
		logger, err := lf.logger(c)
		if err != nil {
			return err
		}
		defer func() { _ = logger.Sync() }()
		ctx, upgrades, finish, err := storage.StartNode(c.ctx, *data, *external == "", c.stdout, logger)
		if err != nil {
			return err
		}
		defer func() { err = finish(err) }() // a storage node told to go on as another release does, here
		var natsLogger *zap.Logger
		if *natsLogs {
			natsLogger = logger.Named("nats")
		}
		sn, err := cf.start(ctx, c.stdout, logger, *data, *listen, *external, *creds, *caFile, natsLogger, names)
		if err != nil {
			return err
		}
		defer sn.Close()
		sn.Store.SetLogger(logger)
		stopOrders, err := upgrades.Serve(ctx, sn, *data)
		if err != nil {
			return err
		}
		defer stopOrders()
		host, _, _ := net.SplitHostPort(*listen)
		if addr := *enrollListen; sn.TLS != nil && sn.Auth != nil && addr != "off" && (addr != "" || !storagenode.IsLoopback(host)) {
			if addr == "" {
				addr = net.JoinHostPort(host, strconv.Itoa(enroll.DefaultPort))
			}
			es, err := enroll.Serve(ctx, enroll.ServerConfig{Listen: addr, TLS: sn.TLS.ServerConfig(), Store: sn.Store, Auth: sn.Auth,
				CredsTTL: *credsTTL, Logger: logger.Named("enroll")})
			if err != nil {
				return err
			}
			defer es.Close()
			fmt.Fprintf(c.stdout, "enrollment of invited boxes on https://%s%s\n", es.Addr(), enroll.Path)
		}
		if sn.Auth != nil {
			// Boxes renew their own credentials here, signed with the
			// account keys only storage nodes hold.
			stopRenewals, err := enroll.ServeRenewals(ctx, enroll.RenewalConfig{Store: sn.Store, Auth: sn.Auth, CredsTTL: *credsTTL,
				Logger: logger.Named("creds")})
			if err != nil {
				return err
			}
			defer stopRenewals()
			fmt.Fprintf(c.stdout, "renewing boxes' credentials (lifetime %s) on %s\n", *credsTTL, sn.Store.Names.CredsSubject("*", "*", "*"))
		}
		cfg, err := serverConfig{
			data: *data, authDir: cf.authDir, name: cf.name,
			stunListen: *stunListen, stunAdvertise: *stunAdvertise, meshRelay: *meshRelay, meshRelayIP: *meshRelayIP, meshRelays: *meshRelays,
			meshCooldown: *meshCooldown, meshSubnet: *meshSubnet, metricsListen: *metrics, statusFlush: *statusFlush,
			dashboardListen: *dashListen, dashboardLogin: *dashLogin, dashboardChartStep: *dashChartStep,
		}.plane(c.stdout, logger)
		if err != nil {
			return err
		}
		// No other box reaches a store on loopback alone: only then may
		// an agent name a loopback address to be admitted at.
		if *external != "" {
			cfg.LoopbackOnly = store.LoopbackURLs(*external)
		} else {
			cfg.LoopbackOnly = storagenode.IsLoopback(host) && (cf.clusterListen == "" || storagenode.IsLoopback(hostOf(cf.clusterListen)))
		}
		if *withAgent {
			cfg.LocalAgent = func(ctx context.Context, s *store.Store) (func(context.Context) error, error) {
				rec, err := machines.Register(ctx, s, cmp.Or(*machine, store.DefaultMachineID()), *advertise)
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(c.stdout, "local agent for machine %s (%s)\n", rec.ID, rec.Address)
				return func(ctx context.Context) error {
					return agentproc.Run(ctx, agent.Config{Store: s, Machine: *rec, DataDir: filepath.Join(*data, "agent"), Logger: logger,
						MaxInstances: 256, StopGrace: 10 * time.Second}, "", "")
				}, nil
			}
		}
		err = controlplane.Run(ctx, sn.Store, cfg)
		fmt.Fprintln(c.stdout, "control server stopping (instances keep running)")
		return err
	}
}

// serverConfig is `control server`'s flags that configure the control
// plane's services, as given.
type serverConfig struct {
	data, authDir, name       string
	stunListen, stunAdvertise string
	meshRelay, meshRelayIP    string
	meshRelays                string
	meshCooldown              time.Duration
	meshSubnet                string
	metricsListen             string
	dashboardListen           string
	dashboardLogin            bool
	dashboardChartStep        time.Duration
	statusFlush               time.Duration
}

// plane checks the flags and turns them into the control plane's config;
// a flag that cannot work is a usage error naming it, before anything
// starts.
func (f serverConfig) plane(progress io.Writer, logger *zap.Logger) (controlplane.Config, error) {
	cfg := controlplane.Config{
		Name: f.name, DataDir: f.data, AuthDir: cmp.Or(f.authDir, filepath.Join(f.data, "auth")),
		MeshRelay: f.meshRelay, MeshCooldown: f.meshCooldown, MeshSubnet: f.meshSubnet,
		MetricsListen: f.metricsListen, StatusFlush: f.statusFlush,
		DashboardListen: f.dashboardListen, DashboardLogin: f.dashboardLogin, DashboardChartStep: f.dashboardChartStep,
		Progress: progress, Logger: logger,
	}
	if f.statusFlush == 0 {
		cfg.StatusFlush = -1 // --status-flush 0: another control server writes it
	}
	var err error
	if cfg.STUNListen, err = hostPorts("--stun-listen", f.stunListen); err != nil {
		return cfg, err
	}
	if cfg.STUNAdvertise, err = hostPorts("--stun-advertise", f.stunAdvertise); err != nil {
		return cfg, err
	}
	for _, a := range cfg.STUNListen {
		if host, _, _ := net.SplitHostPort(a); len(cfg.STUNAdvertise) == 0 && (host == "" || net.ParseIP(host).IsUnspecified()) {
			return cfg, usagef("--stun-listen %s is a wildcard address: set --stun-advertise to addresses nodes can reach", a)
		}
	}
	if cfg.MeshRelays, err = hostPorts("--mesh-relays", f.meshRelays); err != nil {
		return cfg, err
	}
	if f.meshRelayIP != "" {
		if f.meshRelay == "" {
			return cfg, usagef("--mesh-relay-ip needs --mesh-relay")
		}
		if cfg.MeshRelayIP, err = netip.ParseAddr(f.meshRelayIP); err != nil {
			return cfg, usagef("--mesh-relay-ip %q: %v", f.meshRelayIP, err)
		}
	}
	return cfg, nil
}

// hostPorts parses flag's comma-separated host:port list ("" is none).
func hostPorts(flag, list string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	var out []string
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, usagef("%s %q: %v", flag, a, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// hostOf is the host of a host:port address ("" when it has none).
func hostOf(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	return host
}
