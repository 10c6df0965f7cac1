// Package controlplane runs what a control server serves beside the store
// it is bound to: its signer, the mesh registrar with its STUN servers and
// relay, machine admission and routing republish for agents, the completion
// of deploys whose orchestrator stopped, the fleet status aggregator and its
// metrics, the server's announcement and the store's floor (announce.go),
// and, when asked, this box's own agent. `control server` starts
// the store (store/storagenode) and hands it here.
package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/dashboard"
	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/internal/metricsserver"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Config is a control server's services. The zero value of every field
// but DataDir and AuthDir is a working default (no STUN, no relay, no
// metrics, the fleet status written every fleet.DefaultFlushEvery).
type Config struct {
	// Name names this server in its signer's certificate ("control
	// server NAME"); default: the hostname.
	Name string
	// DataDir keeps this server's signer (signers.SignerFile), created and
	// certified under the trust root of AuthDir at first start.
	DataDir, AuthDir string

	// STUNListen are the addresses of this server's STUN servers, for
	// meshd's NAT discovery; none runs without them. STUNAdvertise, if
	// set, is what nodes are told instead of the listeners' addresses
	// (required for a wildcard listener).
	STUNListen, STUNAdvertise []string
	// MeshRelay, if set, runs a mesh relay (TURN) on this UDP address;
	// MeshRelayIP is the address nodes reach it and its relayed ports at
	// (default: MeshRelay's IP). MeshRelays are the relays nodes are told
	// to use (default: this server's own).
	MeshRelay   string
	MeshRelayIP netip.Addr
	MeshRelays  []string
	// MeshCooldown keeps a released mesh IP out of the pool; default
	// registrar.DefaultCooldown. MeshSubnet is where mesh IPs come from;
	// default store.MeshSubnet.
	MeshCooldown time.Duration
	MeshSubnet   string

	// StatusFlush is how often changed namespaces' fleet status is
	// written; 0 is fleet.DefaultFlushEvery, negative: this server never
	// writes it (another control server does).
	StatusFlush time.Duration
	// MetricsListen, if set, serves the fleet status metrics
	// (edgeplane_fleet_*) on this address's /metrics.
	MetricsListen string
	// DashboardListen, if set, serves the web dashboard there, asking
	// for a login off loopback or when DashboardLogin says so.
	DashboardListen string
	DashboardLogin  bool
	// DashboardChartStep is how much time a point of the dashboard's
	// traffic charts stands for; zero: dashboard.DefaultChartStep.
	DashboardChartStep time.Duration
	// LoopbackOnly says no other box reaches the store (it listens on
	// loopback only): machines may then join at a loopback address.
	LoopbackOnly bool

	// LocalAgent, if set, prepares this box's agent once everything else
	// serves (records the machine, so a deploy right after "ready" can
	// place on it) and returns what runs it; Run ends when that fails.
	LocalAgent func(ctx context.Context, s *store.Store) (run func(context.Context) error, err error)

	// Progress receives what a person starting the server wants to see;
	// nil discards it. Logger receives everything else.
	Progress io.Writer
	Logger   *zap.Logger
}

// Run serves cfg on s until ctx ends (or the local agent fails). Instances
// keep running after it returns.
func Run(ctx context.Context, s *store.Store, cfg Config) error {
	out := cfg.Progress
	if out == nil {
		out = io.Discard
	}
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	name := cmp.Or(cfg.Name, store.HostName("edgeplane"))
	if err := s.CheckFloor(ctx, "control server"); store.HasCode(err, store.CodeTooOld) {
		return err
	} else if err != nil {
		logger.Warn("could not read the store's floor; starting anyway", zap.Error(err))
	}

	// Intent this server writes (republished routing, completed deploys,
	// mesh peer records) is signed; what it reads is verified.
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	setup, err := signers.Server(sctx, s, cfg.AuthDir, cfg.DataDir, "control server "+name)
	cancel()
	if err != nil {
		return fmt.Errorf("signing keys: %w", err)
	}
	key, err := setup.Signer.SigningKey()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "signing intent as %s (%s) under trust root %s\n", key.PublicKey(), setup.Signer.Path(), setup.Trust.Root())
	if err := publishBundle(ctx, s, cfg.AuthDir, setup, out); err != nil {
		return err
	}

	stunAddrs, err := startSTUN(ctx, cfg.STUNListen, cfg.STUNAdvertise)
	if err != nil {
		return err
	}
	relays, err := startRelay(ctx, s, cfg, logger.Named("relay"))
	if err != nil {
		return err
	}
	stopReg, err := registrar.Serve(ctx, s, registrar.Config{STUN: stunAddrs, Relays: relays, Cooldown: cfg.MeshCooldown, Subnet: cfg.MeshSubnet,
		Logger: logger.Named("registrar")})
	if err != nil {
		return err
	}
	defer stopReg()
	fmt.Fprintf(out, "mesh registrar serving %s (STUN %s; relays %s)\n", s.Names.RegistrarSubject(">"), strings.Join(stunAddrs, ","),
		cmp.Or(strings.Join(relays, ","), "none"))
	// Agents may not write machine records; they ask here instead.
	stopAdmission, err := machines.ServeAdmission(ctx, s, machines.AdmissionPolicy{LoopbackJoins: cfg.LoopbackOnly})
	if err != nil {
		return fmt.Errorf("serving admission requests: %w", err)
	}
	defer stopAdmission()
	// Agents may not publish routing events; they ask here instead.
	stopRepublish, err := routing.ServeRepublish(ctx, s)
	if err != nil {
		return fmt.Errorf("serving routing republish requests: %w", err)
	}
	defer stopRepublish()

	var wg sync.WaitGroup
	// What this server is, for readers' writers and `control fleet
	// versions` (announce.go).
	wg.Add(1)
	go func() {
		defer wg.Done()
		announce(ctx, s, name, logger.Named("announce"))
	}()
	// Deploys whose orchestrator stopped (killed, its laptop closed) are
	// finished here: published, drained and cleaned up once its namespace
	// lease expires, with no further command.
	wg.Add(1)
	go func() {
		defer wg.Done()
		runCompleter(ctx, s, out, logger.Named("completer"))
	}()
	// The fleet at a glance (control status), each namespace written at
	// most once per StatusFlush, by one control server at a time.
	var agg *fleet.Aggregator
	if cfg.StatusFlush >= 0 {
		if agg, err = fleet.New(s, fleet.Config{FlushEvery: cfg.StatusFlush, Logger: logger.Named("fleet")}); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg.RunElected(ctx, store.DefaultHolder())
		}()
	}
	if cfg.MetricsListen != "" {
		reg := prometheus.NewRegistry()
		if agg != nil {
			reg.MustRegister(agg)
		}
		stop, err := metricsserver.Serve(ctx, cfg.MetricsListen, reg)
		if err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(out, "metrics on http://%s/metrics\n", cfg.MetricsListen)
	}
	if cfg.DashboardListen != "" {
		login := cfg.DashboardLogin || dashboard.RequiresLogin(cfg.DashboardListen)
		dash, err := dashboard.New(s, dashboard.Config{RequireLogin: login, ChartStep: cfg.DashboardChartStep, Logger: logger.Named("dashboard")})
		if err != nil {
			return err
		}
		url, wait, err := dashboard.Serve(ctx, cfg.DashboardListen, dash)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			dash.Run(ctx)
			wait()
		}()
		note := "open: loopback only"
		if login {
			note = "log in with a token from `control dashboard token`"
		}
		fmt.Fprintf(out, "dashboard on %s (%s)\n", url, note)
	}
	errc := make(chan error, 1)
	if cfg.LocalAgent != nil {
		run, err := cfg.LocalAgent(ctx, s)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errc <- err
			}
		}()
	}
	fmt.Fprintln(out, "control server ready")
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	wg.Wait()
	return err
}

// runCompleter claims the hosts of stores written before host ownership
// existed, then finishes abandoned deploys until ctx ends, starting again
// whenever its watch fails (the store unreachable for a while).
func runCompleter(ctx context.Context, s *store.Store, out io.Writer, log *zap.Logger) {
	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	conflicts, err := hosts.Backfill(bctx, s)
	cancel()
	if err != nil && ctx.Err() == nil {
		log.Warn("claiming the hosts of live commits", zap.Error(err))
	}
	for _, c := range conflicts {
		log.Warn("host routed by two namespaces; the first keeps it", zap.String("conflict", c))
	}
	d := deploy.New(s, deploy.Options{Out: out})
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

// startRelay runs this server's mesh relay, if cfg asks for one, for as
// long as ctx lives, and returns the relays nodes are told: cfg.MeshRelays,
// or this one.
func startRelay(ctx context.Context, s *store.Store, cfg Config, logger *zap.Logger) ([]string, error) {
	if cfg.MeshRelay == "" {
		return cfg.MeshRelays, nil
	}
	secret, err := s.MeshRelaySecret(ctx)
	if err != nil {
		return nil, fmt.Errorf("mesh relay: %w", err)
	}
	srv, err := relay.Listen(ctx, relay.ServerConfig{Listen: cfg.MeshRelay, RelayIP: cfg.MeshRelayIP, Secret: secret, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("starting the mesh relay: %w", err)
	}
	if len(cfg.MeshRelays) > 0 {
		return cfg.MeshRelays, nil
	}
	return []string{netip.AddrPortFrom(srv.RelayIP(), srv.Addr().Port()).String()}, nil
}

// startSTUN listens on each address for as long as ctx lives and returns
// the addresses meshd nodes should be told: advertise, else the listeners'.
func startSTUN(ctx context.Context, listen, advertise []string) ([]string, error) {
	var adv []string
	for _, a := range listen {
		srv, err := stunserver.Listen(ctx, a)
		if err != nil {
			return nil, fmt.Errorf("starting STUN on %s: %w", a, err)
		}
		adv = append(adv, srv.Addr().String())
		if srv.Addr().IP.IsUnspecified() && len(advertise) == 0 {
			return nil, store.Errorf(store.CodeInvalid, "STUN listener %s is a wildcard address: nodes must be told addresses they can reach (--stun-advertise)", a).
				With("stun_listen", a)
		}
	}
	if len(advertise) > 0 {
		return advertise, nil
	}
	return adv, nil
}

// publishBundle records the auth dir's CA bundle in the store, signed by
// the trust root, for long-running clients to follow (a CA rotation); a
// server whose auth dir holds no CA or no root has none to publish, and
// an older copy of the auth dir does not replace a newer bundle. Nor does
// a server whose store connection is plaintext (--tls off): a client
// following the bundle would then speak TLS to a node that does not.
func publishBundle(ctx context.Context, s *store.Store, authDir string, setup *signers.Setup, out io.Writer) error {
	if setup.Root == nil {
		return nil
	}
	if _, err := s.NC.TLSConnectionState(); err != nil {
		return nil
	}
	f, err := storagenode.LoadFleetTLS(authDir)
	if err != nil || f == nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	published, err := s.PublishTLSBundle(pctx, setup.Root, f.BundlePEM, f.Generation)
	if err != nil {
		return fmt.Errorf("publishing the fleet's CA bundle: %w", err)
	}
	if published {
		fmt.Fprintf(out, "published the fleet's CA bundle (generation %d, %d CAs) for clients to follow\n", f.Generation, len(f.Bundle))
	}
	return nil
}
