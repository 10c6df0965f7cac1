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
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/signing/signers"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func setupServer(fs *flag.FlagSet) func(*call) error {
	data := fs.String("data", "", "data dir: the JetStream store and, with --agent, the local agent (required)")
	listen := fs.String("listen", storagenode.DefaultListen, "client address of the embedded NATS server")
	external := fs.String("nats", "", "use this external NATS (cluster) URL instead of the embedded server")
	creds := fs.String("creds", "", "credentials file for --nats")
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
	statusFlush := fs.Duration("status-flush", fleet.DefaultFlushEvery, "how often changed namespaces' fleet status is written (control status lags by up to this much); 0: this server never writes it (another control server does)")
	cf := addClusterFlags(fs)
	lf := addLogFlags(fs)
	return func(c *call) error {
		if *data == "" {
			return usagef("--data is required")
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
		var natsLogger *zap.Logger
		if *natsLogs {
			natsLogger = logger.Named("nats")
		}
		return runServer(c.ctx, c.stdout, logger, serverConfig{
			data: *data, listen: *listen, external: *external, creds: *creds, names: names, cluster: cf, natsLogger: natsLogger,
			withAgent: *withAgent, machine: *machine, advertise: *advertise,
			stunListen: *stunListen, stunAdvertise: *stunAdvertise, meshRelay: *meshRelay, meshRelayIP: *meshRelayIP, meshRelays: *meshRelays,
			meshCooldown: *meshCooldown, meshSubnet: *meshSubnet,
			metricsListen: *metrics,
			statusFlush:   *statusFlush,
		})
	}
}

// serverConfig is `control server`'s command line.
type serverConfig struct {
	data, listen, external, creds string
	names                         store.Names
	cluster                       *clusterFlags
	natsLogger                    *zap.Logger

	withAgent          bool
	machine, advertise string

	stunListen, stunAdvertise string
	meshRelay, meshRelayIP    string
	meshRelays                string
	meshCooldown              time.Duration
	meshSubnet                string
	metricsListen             string
	statusFlush               time.Duration
}

// runServer runs the control plane until ctx ends. Progress a person
// starting it wants to see goes to stdout; everything else is logged.
func runServer(ctx context.Context, stdout io.Writer, logger *zap.Logger, cfg serverConfig) error {
	sn, err := cfg.cluster.start(ctx, stdout, logger, cfg.data, cfg.listen, cfg.external, cfg.creds, cfg.natsLogger, cfg.names)
	if err != nil {
		return err
	}
	defer sn.Close()
	s := sn.Store

	// Intent this server writes (republished routing, completed deploys,
	// mesh peer records) is signed; what it reads is verified.
	authDir := cfg.cluster.authDir
	if authDir == "" {
		authDir = filepath.Join(cfg.data, "auth")
	}
	name := cfg.cluster.name
	if name == "" {
		name = store.HostName("edgeplane")
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	setup, err := signers.Server(sctx, s, authDir, cfg.data, "control server "+name)
	cancel()
	if err != nil {
		return fmt.Errorf("signing keys: %w", err)
	}
	key, err := setup.Signer.SigningKey()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "signing intent as %s (%s) under trust root %s\n", key.PublicKey(), setup.Signer.Path(), setup.Trust.Root())

	stunAddrs, err := startSTUN(ctx, cfg.stunListen, cfg.stunAdvertise)
	if err != nil {
		return err
	}
	relays, err := startRelay(ctx, s, cfg, logger.Named("relay"))
	if err != nil {
		return err
	}
	stopReg, err := registrar.Serve(ctx, s, registrar.Config{STUN: stunAddrs, Relays: relays, Cooldown: cfg.meshCooldown, Subnet: cfg.meshSubnet,
		Logger: logger.Named("registrar")})
	if err != nil {
		return err
	}
	defer stopReg()
	fmt.Fprintf(stdout, "mesh registrar serving %s (STUN %s; relays %s)\n", cfg.names.RegistrarSubject(">"), strings.Join(stunAddrs, ","),
		cmp.Or(strings.Join(relays, ","), "none"))
	// Agents may not write machine records; they ask here instead.
	stopAdmission, err := machines.ServeAdmission(ctx, s)
	if err != nil {
		return fmt.Errorf("serving admission requests: %w", err)
	}
	defer stopAdmission()
	// Agents may not publish routing events; they ask here instead.
	stopRepublish, err := s.ServeRepublish(ctx)
	if err != nil {
		return fmt.Errorf("serving routing republish requests: %w", err)
	}
	defer stopRepublish()

	var wg sync.WaitGroup
	// Deploys whose orchestrator stopped (killed, its laptop closed) are
	// finished here: published, drained and cleaned up once its namespace
	// lease expires, with no further command.
	wg.Add(1)
	go func() {
		defer wg.Done()
		runCompleter(ctx, s, stdout, logger)
	}()
	// The fleet at a glance (control status), each namespace written at
	// most once per --status-flush, by one control server at a time.
	var agg *fleet.Aggregator
	if cfg.statusFlush > 0 {
		if agg, err = fleet.New(s, fleet.Config{FlushEvery: cfg.statusFlush, Logger: logger.Named("fleet")}); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg.RunElected(ctx, store.DefaultHolder())
		}()
	}
	if cfg.metricsListen != "" {
		reg := prometheus.NewRegistry()
		if agg != nil {
			reg.MustRegister(agg)
		}
		stop, err := serveMetrics(ctx, cfg.metricsListen, reg)
		if err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(stdout, "metrics on http://%s/metrics\n", cfg.metricsListen)
	}
	errc := make(chan error, 1)
	if cfg.withAgent {
		id := cfg.machine
		if id == "" {
			id = store.DefaultMachineID()
		}
		rec, err := machines.Register(ctx, s, id, cfg.advertise)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "local agent for machine %s (%s)\n", rec.ID, rec.Address)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runAgent(ctx, s, rec, agentOptions{dir: filepath.Join(cfg.data, "agent"), maxInstances: 256, stopGrace: 10 * time.Second}, logger); err != nil {
				errc <- err
			}
		}()
	}
	fmt.Fprintln(stdout, "control server ready")
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	wg.Wait()
	fmt.Fprintln(stdout, "control server stopping (instances keep running)")
	return err
}

// runCompleter claims the hosts of stores written before host ownership
// existed, then finishes abandoned deploys until ctx ends, starting again
// whenever its watch fails (the store unreachable for a while).
func runCompleter(ctx context.Context, s *store.Store, stdout io.Writer, logger *zap.Logger) {
	log := logger.Named("completer")
	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	conflicts, err := s.BackfillHosts(bctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		log.Warn("claiming the hosts of live commits", zap.Error(err))
	}
	for _, c := range conflicts {
		log.Warn("host routed by two namespaces; the first keeps it", zap.String("conflict", c))
	}
	d := deploy.New(s, deploy.Options{Out: stdout})
	for {
		err := d.RunCompleter(ctx, deploy.CompleterOptions{OnError: func(ns string, err error) {
			log.Warn("finishing deploys", zap.String("namespace", ns), zap.Error(err))
		}})
		if ctx.Err() != nil {
			return
		}
		log.Warn("deploy completer stopped; starting again", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// startRelay runs this server's mesh relay (--mesh-relay) for as long as
// ctx lives, and returns the relays nodes are told: --mesh-relays, or this
// one.
func startRelay(ctx context.Context, s *store.Store, cfg serverConfig, logger *zap.Logger) ([]string, error) {
	list, err := hostPorts("--mesh-relays", cfg.meshRelays)
	if err != nil {
		return nil, err
	}
	if cfg.meshRelay == "" {
		if cfg.meshRelayIP != "" {
			return nil, usagef("--mesh-relay-ip needs --mesh-relay")
		}
		return list, nil
	}
	var ip netip.Addr
	if cfg.meshRelayIP != "" {
		if ip, err = netip.ParseAddr(cfg.meshRelayIP); err != nil {
			return nil, usagef("--mesh-relay-ip %q: %v", cfg.meshRelayIP, err)
		}
	}
	secret, err := s.MeshRelaySecret(ctx)
	if err != nil {
		return nil, fmt.Errorf("mesh relay: %w", err)
	}
	srv, err := relay.Listen(ctx, relay.ServerConfig{Listen: cfg.meshRelay, RelayIP: ip, Secret: secret, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("starting the mesh relay: %w", err)
	}
	own := netip.AddrPortFrom(srv.RelayIP(), srv.Addr().Port()).String()
	if len(list) == 0 {
		list = []string{own}
	}
	return list, nil
}

// startSTUN listens on each address of list (comma separated) for as long as
// ctx lives and returns the addresses meshd nodes should be told.
func startSTUN(ctx context.Context, list, advertise string) ([]string, error) {
	var listen []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			listen = append(listen, a)
		}
	}
	var adv []string
	for _, a := range listen {
		srv, err := stunserver.Listen(ctx, a)
		if err != nil {
			return nil, fmt.Errorf("starting STUN on %s: %w", a, err)
		}
		adv = append(adv, srv.Addr().String())
		if ip := srv.Addr().IP; ip.IsUnspecified() && advertise == "" {
			return nil, usagef("--stun-listen %s is a wildcard address: set --stun-advertise to addresses nodes can reach", a)
		}
	}
	if advertise != "" {
		return hostPorts("--stun-advertise", advertise)
	}
	return adv, nil
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
