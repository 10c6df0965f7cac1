// Package caddymodule holds edgeplane's Caddy modules: the `edgeplane` app
// that keeps the routing projection, the `http.handlers.edgeplane` gateway
// handler, the `http.reverse_proxy.upstreams.edgeplane` upstream source, the
// `tls.permission.edgeplane` on-demand TLS permission, the
// `admin.api.edgeplane` status endpoints, and layer 4: the gateway ports
// the app opens as routing asks (layer4.go), the
// `layer4.handlers.edgeplane` connection handler and the
// `tls.handshake_match.edgeplane_passthrough` matcher. They are thin
// adapters over the Caddy-free package projection. A request and a
// layer-4 connection pick their instance by one rule (App.candidates).
package caddymodule

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the `edgeplane` app: it owns the NATS connection and the routing
// projection of this process. The projection outlives config reloads: apps
// with the same connection settings share one projection through a usage
// pool, so a reload neither reconnects nor rebuilds.
type App struct {
	// The control plane to follow: nats_url, creds_file, installation and
	// authority, as in every edgeplane module.
	store.Config
	// SnapshotPath is where the last good routing view is persisted, to
	// serve from when the gateway starts while NATS is unreachable.
	// Default: <caddy data dir>/edgeplane/routing-<installation>-<authority>.json.
	SnapshotPath string `json:"snapshot_path,omitempty"`
	// GatewayName names this gateway in the observations `control deploy
	// apply` waits for. Default: the host name.
	GatewayName string `json:"gateway_name,omitempty"`
	// HealthInterval is how often the gateway probes every routable
	// endpoint at its service's readiness path (a TCP connect without
	// one); an endpoint whose last probe failed gets no new requests
	// while its service has another. Default: 1s.
	HealthInterval caddy.Duration `json:"health_interval,omitempty"`
	// HealthTimeout bounds one probe. Default: 1s.
	HealthTimeout caddy.Duration `json:"health_timeout,omitempty"`
	// DisableHealthChecks turns the probes off: every routable endpoint
	// gets requests until the routing says otherwise.
	DisableHealthChecks bool `json:"disable_health_checks,omitempty"`
	// Region is this gateway's region: it serves each service from the
	// instances in its region first (the service's locality policy).
	// A DNS label. Default: the region of the machine whose ID is
	// gateway_name (a gateway beside an agent), followed as it changes;
	// none when there is no such machine or it has no region.
	Region string `json:"region,omitempty"`
	// TrafficInterval is how often the gateway writes its per-service
	// traffic counters to the store, for the control plane to sum.
	// Default: 5s.
	TrafficInterval caddy.Duration `json:"traffic_interval,omitempty"`
	// RegionProbeInterval is how often the gateway measures the round
	// trip to each other region (a TCP connect to one of its endpoints),
	// to fail over to the nearest first. Default: 10s; 0 turns measuring
	// off (regions a service's locality order does not name are then
	// tried by name).
	RegionProbeInterval *caddy.Duration `json:"region_probe_interval,omitempty"`
	// Layer4Bind is the IP address the gateway binds its layer-4 ports
	// (the services' tcp and udp ports) on. Default: every interface.
	Layer4Bind string `json:"layer4_bind,omitempty"`
	// DisableLayer4 keeps every layer-4 port closed (TLS passthrough on
	// the HTTPS listener is configured on its own, and unaffected).
	DisableLayer4 bool `json:"disable_layer4,omitempty"`
	// DisableAccessLog turns the gateway's access lines off: none is
	// written to the "edgeplane.access" logger or published for `control
	// logs --access` (request IDs are still set).
	DisableAccessLog bool `json:"disable_access_log,omitempty"`
	// AccessLogRate is how many access lines a second of one service the
	// gateway publishes at most for `control logs --access` (past it,
	// lines are sampled and say their share); 0 publishes none, the
	// local log keeps every line. Default: 100.
	AccessLogRate *int `json:"access_log_rate,omitempty"`

	key string
	// ownPorts are the ports the config's HTTP servers listen on, which
	// no layer-4 port may take.
	ownPorts []store.PortKey
	ctx      caddy.Context
	shared   *sharedProjection
	logger   *zap.Logger
	// access is the access logging (accesslog.go); nil when off.
	access *accessLog

	health     *healthChecker
	stopHealth context.CancelFunc
	healthDone chan struct{}

	// rtt measures the other regions' round trips (nearest.go); nil when
	// measuring is off.
	rtt     *regionRTT
	stopRTT context.CancelFunc
	rttDone chan struct{}
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "edgeplane",
		New: func() caddy.Module { return new(App) },
	}
}

// pool holds one projection per distinct connection config across reloads.
var pool = caddy.NewUsagePool()

// current is the running app, for the admin endpoints (which are not
// provisioned with a way to reach apps at request time).
var current atomic.Pointer[App]

// Provision fills defaults and attaches to (or creates) the shared projection.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger, a.ctx = ctx.Logger(), ctx
	names, err := a.Resolve()
	if err != nil {
		return fmt.Errorf("provisioning edgeplane app: %w", err)
	}
	if a.GatewayName == "" {
		a.GatewayName = store.HostName("gateway")
	}
	if a.SnapshotPath == "" {
		a.SnapshotPath = filepath.Join(caddy.AppDataDir(), "edgeplane",
			fmt.Sprintf("routing-%s-%s.json", names.Installation, names.Authority))
	}
	// A trust root learned on first contact (no trust_root configured, no
	// credentials carrying one) is pinned beside the snapshot.
	a.TrustPinFile = filepath.Join(filepath.Dir(a.SnapshotPath), fmt.Sprintf("trust-root-%s-%s", names.Installation, names.Authority))
	key, err := json.Marshal([]string{a.NATSURL, a.CredsFile, names.Installation, names.Authority, a.SnapshotPath, a.GatewayName, a.TrustRoot,
		time.Duration(a.TrafficInterval).String()})
	if err != nil {
		return fmt.Errorf("provisioning edgeplane app: %w", err)
	}
	a.key = string(key)
	val, _, err := pool.LoadOrNew(a.key, func() (caddy.Destructor, error) {
		return newSharedProjection(a)
	})
	if err != nil {
		return fmt.Errorf("provisioning edgeplane app: %w", err)
	}
	a.shared = val.(*sharedProjection)
	if err := projection.RegisterMetrics(ctx.GetMetricsRegistry(), a.shared.proj); err != nil {
		return fmt.Errorf("provisioning edgeplane app: registering metrics: %w", err)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(trafficCollector{a.shared.traffic}); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("provisioning edgeplane app: registering traffic metrics: %w", err)
		}
	}
	a.access = newAccessLog(a)
	if !a.DisableHealthChecks {
		interval := cmp.Or(time.Duration(a.HealthInterval), DefaultHealthInterval)
		timeout := cmp.Or(time.Duration(a.HealthTimeout), DefaultHealthTimeout)
		a.health = newHealthChecker(interval, timeout, func() *projection.View { return a.shared.proj.View() }, a.logger.Named("health"))
	}
	probe := DefaultRegionProbeInterval
	if a.RegionProbeInterval != nil {
		probe = time.Duration(*a.RegionProbeInterval)
	}
	if probe > 0 {
		a.rtt = newRegionRTT(probe, a.shared.proj.View, a.shared.proj.Changed, func() string { return a.home(a.shared.proj.View()).region }, a.logger.Named("rtt"))
		if reg := ctx.GetMetricsRegistry(); reg != nil {
			if err := reg.Register(regionRTTCollector{a.rtt}); err != nil {
				return fmt.Errorf("provisioning edgeplane app: registering region round trip metrics: %w", err)
			}
		}
	}
	return nil
}

// Validate checks the config without I/O.
func (a *App) Validate() error {
	if a.shared == nil {
		return fmt.Errorf("edgeplane app not provisioned")
	}
	if a.RegionProbeInterval != nil && *a.RegionProbeInterval < 0 {
		return fmt.Errorf("edgeplane app: region_probe_interval must not be negative")
	}
	if a.AccessLogRate != nil && *a.AccessLogRate < 0 {
		return fmt.Errorf("edgeplane app: access_log_rate must not be negative")
	}
	if a.HealthInterval < 0 || a.HealthTimeout < 0 || a.TrafficInterval < 0 {
		return fmt.Errorf("edgeplane app: health_interval, health_timeout and traffic_interval must not be negative")
	}
	if a.Layer4Bind != "" {
		if _, err := netip.ParseAddr(a.Layer4Bind); err != nil {
			return fmt.Errorf("edgeplane app: layer4_bind %q is not an IP address", a.Layer4Bind)
		}
	}
	if a.Region != "" && !store.ValidRegion(a.Region) {
		return fmt.Errorf("edgeplane app: region %q is not a DNS label (lower-case letters, digits and '-', up to 63)", a.Region)
	}
	return nil
}

// Start runs the projection (once per shared projection).
func (a *App) Start() error {
	a.ownPorts = ownPortsOf(a.ctx)
	a.shared.start()
	if a.health != nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.stopHealth, a.healthDone = cancel, make(chan struct{})
		go func() {
			defer close(a.healthDone)
			a.health.run(ctx)
		}()
	}
	if a.rtt != nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.stopRTT, a.rttDone = cancel, make(chan struct{})
		go func() {
			defer close(a.rttDone)
			a.rtt.run(ctx)
		}()
	}
	current.Store(a)
	a.shared.app.Store(a)
	// The ports follow this config's layer4_bind and disable_layer4 now.
	a.shared.ports.poke()
	a.logger.Info("edgeplane gateway projection running",
		zap.String("nats", a.NATSURL), zap.String("gateway", a.GatewayName), zap.String("snapshot", a.SnapshotPath))
	return nil
}

// Stop detaches the app; the projection keeps running for the next config
// until the last app using it is cleaned up.
func (a *App) Stop() error {
	current.CompareAndSwap(a, nil)
	a.shared.app.CompareAndSwap(a, nil)
	if a.stopHealth != nil {
		a.stopHealth()
		<-a.healthDone
	}
	if a.stopRTT != nil {
		a.stopRTT()
		<-a.rttDone
	}
	return nil
}

// Cleanup releases this app's use of the shared projection.
func (a *App) Cleanup() error {
	if a.key == "" {
		return nil
	}
	_, err := pool.Delete(a.key)
	if err != nil {
		return fmt.Errorf("releasing edgeplane projection: %w", err)
	}
	return nil
}

// Projection is this process's routing projection, for other apps (DNS)
// that serve from the same view.
func (a *App) Projection() *projection.Projection { return a.shared.proj }

// sharedProjection is a projection and the NATS connections it opened,
// shared by every app with the same settings.
type sharedProjection struct {
	proj    *projection.Projection
	logger  *zap.Logger
	traffic *trafficTable
	// slow tracks newly routable endpoints for slow start (slowstart.go);
	// it lives with the projection, so a config reload neither ends a
	// ramp nor starts one.
	slow *slowStart
	// app is the app serving now, whose health checks the set-aside
	// report reads.
	app atomic.Pointer[App]

	startOnce sync.Once
	cancel    context.CancelFunc
	done      chan struct{}

	mu    sync.Mutex
	conns []*store.Store

	// cookieKey is the fleet's canary cookie key (canaryKeyLoop), nil
	// until read; keyTried is set once the first connect asked for it.
	cookieKey atomic.Pointer[[]byte]
	keyTried  atomic.Bool

	// home is the gateway's region as derived for the latest view
	// (App.home).
	home atomic.Pointer[homeOf]

	// l4 holds the open layer-4 connections and their drains
	// (layer4_conns.go), ports the gateway's layer-4 ports (layer4.go).
	l4    *l4Registry
	ports *l4Ports

	// rates counts the rate-limited routes and shares the counts with
	// the other gateways (ratelimit.go).
	rates *rateTable
}

func newSharedProjection(a *App) (*sharedProjection, error) {
	// The process-wide logger, not this config's: the projection outlives
	// the config that created it.
	logger := caddy.Log().Named("edgeplane.projection")
	s := &sharedProjection{logger: logger, done: make(chan struct{}), traffic: newTrafficTable(), l4: newL4Registry()}
	s.ports = newL4Ports(s, logger.Named("layer4"))
	s.rates = newRateTable(a.GatewayName)
	s.traffic.home = s.region
	s.traffic.catchUp = s.l4.catchUp
	cfg, name := a.Config, a.GatewayName
	connect := func(ctx context.Context) (*store.Store, error) {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// While it lives, the connection's CA bundle follows the fleet's
		// (a CA rotation reaches this gateway).
		st, err := cfg.DialFollowing(octx, store.ConnectOptions{Name: "edgeplane-gateway " + name, Timeout: 2 * time.Second, ReconnectForever: true},
			func(err error) { logger.Warn("following the fleet's CA bundle", zap.Error(err)) })
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.conns = append(s.conns, st)
		s.mu.Unlock()
		// The canary cookie key before the routing, so that a sticky split
		// is not served unsigned for want of it: once, briefly (a gateway
		// whose credentials predate the key gets no answer, and must not
		// wait at every connect); canaryKeyLoop retries.
		if s.keyTried.CompareAndSwap(false, true) {
			kctx, cancel := context.WithTimeout(octx, 500*time.Millisecond)
			_ = s.readCanaryKey(kctx, st)
			cancel()
		}
		return st, nil
	}
	traffic := func() (time.Time, []store.ServiceTraffic, []store.EndpointSetAside) {
		return s.traffic.since, s.traffic.snapshot(store.MaxTrafficServices), s.setAside()
	}
	if err := checkFloor(cfg, name, logger); err != nil {
		return nil, err
	}
	p, err := projection.New(projection.Config{Connect: connect, SnapshotPath: a.SnapshotPath, Name: name, Logger: logger,
		Traffic: traffic, TrafficInterval: time.Duration(a.TrafficInterval), Region: s.region, Layer4: s.l4Observation})
	if err != nil {
		return nil, err
	}
	s.proj = p
	s.l4.drained = p.Report
	s.slow = newSlowStart()
	return s, nil
}

// checkFloor refuses a gateway of a generation below the store's floor
// (a too_old error naming the release the store needs) when the store
// answers at start. A store that does not answer, or a floor this
// gateway's credentials cannot read, lets it start: a gateway serves its
// routing snapshot while the store is away.
func checkFloor(cfg store.Config, name string, logger *zap.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cfg.Dial(ctx, store.ConnectOptions{Name: "edgeplane-gateway " + name + " (floor)", Timeout: 2 * time.Second})
	if err != nil {
		logger.Warn("store not reached at start: the store's floor is not checked", zap.Error(err))
		return nil
	}
	defer st.NC.Close()
	switch err := st.CheckFloor(ctx, "gateway"); {
	case store.HasCode(err, store.CodeTooOld):
		return err
	case err != nil:
		logger.Warn("could not read the store's floor", zap.Error(err))
	}
	return nil
}

func (s *sharedProjection) start() {
	s.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		drained, keyed, ramped, ported := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
		rated := make(chan struct{})
		go func() {
			defer close(rated)
			s.rates.runSharing(ctx, s.latestStore, s.logger.Named("ratelimit"))
		}()
		go func() {
			defer close(drained)
			watchDrain(ctx)
		}()
		go func() {
			defer close(keyed)
			s.canaryKeyLoop(ctx)
		}()
		go func() {
			defer close(ramped)
			s.slow.run(ctx, s.proj.View, s.proj.Changed)
		}()
		go func() {
			defer close(ported)
			s.ports.run(ctx)
		}()
		go func() {
			defer close(s.done)
			_ = s.proj.Run(ctx)
			<-ported
			<-rated
			<-drained
			<-keyed
			<-ramped
		}()
	})
}

// Destruct stops the projection when the last app using it is gone.
func (s *sharedProjection) Destruct() error {
	started := false
	s.startOnce.Do(func() {}) // a never-started projection has nothing to stop
	if s.cancel != nil {
		s.cancel()
		started = true
	}
	if started {
		<-s.done
	}
	// The ports are closed; the connections they took end with the
	// gateway.
	s.l4.closeAll()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.conns {
		st.NC.Close()
	}
	s.conns = nil
	return nil
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*sharedProjection)(nil)
)

// conn is the latest store connection the projection opened (the one it
// uses: it opens another only once that one is closed), nil before one.
func (s *sharedProjection) conn() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		return nil
	}
	return s.conns[len(s.conns)-1]
}

// region is the serving app's region now ("" before one serves).
func (s *sharedProjection) region() string {
	a := s.app.Load()
	if a == nil {
		return ""
	}
	return a.home(s.proj.View()).region
}

// setAside lists the endpoints the serving app sets aside now, as
// /edgeplane/routes does.
func (s *sharedProjection) setAside() []store.EndpointSetAside {
	a := s.app.Load()
	if a == nil {
		return nil
	}
	v := s.proj.View()
	var out []store.EndpointSetAside
	for _, svc := range v.Services() {
		ri := routeInfo(a, v, svc)
		for _, sa := range ri.SetAside {
			if len(out) == store.MaxSetAsideReported {
				return out
			}
			out = append(out, store.EndpointSetAside{Namespace: svc.Namespace, Service: svc.Name, Instance: sa.InstanceID,
				Machine: sa.Machine, Reason: sa.Reason, Since: sa.Since.UTC(), FailOpen: ri.FailOpen})
		}
	}
	return out
}
