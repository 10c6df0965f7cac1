// Package caddydns runs the edgeplane DNS server (package dnsproj) as a
// Caddy app, "edgeplane_dns". It answers from the gateway app's projection
// in the same process (ctx.App("edgeplane")), so one process keeps one
// projection, and it opens its sockets through Caddy's listener pool so a
// config reload never drops them.
package caddydns

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/dnsproj"
	"github.com/edgeplane/edgeplane/projection"
)

func init() {
	caddy.RegisterModule(App{})
}

// GatewayAppID is the app whose projection DNS answers from.
const GatewayAppID = "edgeplane"

// App serves the cluster zone over DNS (UDP and TCP) from the gateway's
// routing projection, with a cache and a forwarder for other names.
type App struct {
	// Listen is the addresses ("host:port") to serve on, each over UDP and
	// TCP. Default: ["127.0.0.1:1053"].
	Listen []string `json:"listen,omitempty"`
	// Zone is the cluster zone answered from the projection. Default:
	// "edgeplane.internal.".
	Zone string `json:"zone,omitempty"`
	// Region is this server's region: a service's name is answered with
	// its instances in this region first, then the other regions' in the
	// service's locality order (only this region's under a strict
	// policy). One DNS label (lower-case letters, digits, '-'). Default:
	// the edgeplane app's region, as it follows its machine's, when that
	// app offers it; else none (every active region alike).
	Region string `json:"region,omitempty"`
	// TTL of the zone's records and its negative-caching TTL. Default: 5s.
	TTL caddy.Duration `json:"ttl,omitempty"`
	// NSAddresses are published as the addresses of ns.<zone>. Default:
	// the IP hosts of Listen that are not wildcards.
	NSAddresses []string `json:"ns_addresses,omitempty"`
	// Forward sends names outside the zone to upstream resolvers. Default:
	// none; such names get REFUSED.
	Forward *Forward `json:"forward,omitempty"`
	// Cache holds forwarded answers (never zone answers). Default: on,
	// 10000 entries, when Forward is set.
	Cache *Cache `json:"cache,omitempty"`
	// MaxUDPSize caps UDP replies; larger ones are truncated (TC) and the
	// client retries over TCP. Default: 1232.
	MaxUDPSize int `json:"max_udp_size,omitempty"`
	// MaxQuerySize drops larger queries. Default: 1232.
	MaxQuerySize int `json:"max_query_size,omitempty"`

	srv        *dnsproj.Server
	regionFrom string // "edgeplane" when the region is the gateway's
	addrs      []caddy.NetworkAddress
	held       []caddy.NetworkAddress // sockets acquired by Start
	logger     *zap.Logger
}

// Forward configures the upstream resolvers.
type Forward struct {
	// To lists upstream resolvers as IP or IP:port (port 53 by default).
	To []string `json:"to,omitempty"`
	// Policy is "sequential" (the first healthy upstream, in order) or
	// "random". Default: "sequential".
	Policy string `json:"policy,omitempty"`
	// Timeout bounds one attempt at one upstream. Default: 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// HealthCheck is how often each upstream is probed. Default: 2s.
	HealthCheck caddy.Duration `json:"health_check,omitempty"`
	// MaxFails is how many failed queries in a row mark an upstream down.
	// Default: 2.
	MaxFails int `json:"max_fails,omitempty"`
}

// Cache configures the cache of forwarded answers.
type Cache struct {
	// Disabled turns the cache off.
	Disabled bool `json:"disabled,omitempty"`
	// Size is the most answers kept. Default: 10000.
	Size int `json:"size,omitempty"`
	// MaxTTL caps how long a positive answer is kept. Default: 1h.
	MaxTTL caddy.Duration `json:"max_ttl,omitempty"`
	// MaxNegativeTTL caps how long NXDOMAIN/NODATA is kept. Default: 30m.
	MaxNegativeTTL caddy.Duration `json:"max_negative_ttl,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "edgeplane_dns",
		New: func() caddy.Module { return new(App) },
	}
}

// projectionProvider is what the gateway app offers (caddymodule.App).
type projectionProvider interface {
	Projection() *projection.Projection
}

// regionProvider is the gateway app's region under a view, when it offers
// one (its configured region, else its machine's as the view has it): DNS
// beside a gateway answers as the gateway routes.
type regionProvider interface {
	RegionFor(v *projection.View) string
	NearestRegions() ([]string, uint64)
}

// Provision sets defaults, finds the gateway's projection and builds the
// server; it opens no sockets.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if len(a.Listen) == 0 {
		a.Listen = []string{dnsproj.DefaultListen}
	}
	addrs, err := parseListen(a.Listen)
	if err != nil {
		return err
	}
	a.addrs = addrs
	cfg, err := a.config(addrs)
	if err != nil {
		return err
	}
	cfg.Logger = a.logger
	cfg.Registerer = ctx.GetMetricsRegistry()

	gw, err := ctx.App(GatewayAppID)
	if err != nil {
		return fmt.Errorf("loading the %s app for its projection: %w", GatewayAppID, err)
	}
	pp, ok := gw.(projectionProvider)
	if !ok {
		return fmt.Errorf("app %s (%T) does not provide a routing projection", GatewayAppID, gw)
	}
	if rp, ok := gw.(regionProvider); ok && cfg.Region == "" {
		cfg.RegionFor = func(v dnsproj.View) string {
			pv, _ := v.(*projection.View) // what ProjectionSource hands out
			if pv == nil {
				return ""
			}
			return rp.RegionFor(pv)
		}
		cfg.Nearest = rp.NearestRegions
		a.regionFrom = GatewayAppID
	}
	a.srv, err = dnsproj.New(cfg, dnsproj.ProjectionSource(pp.Projection()))
	if err != nil {
		return fmt.Errorf("provisioning dns server: %w", err)
	}
	return nil
}

// config translates the JSON config to the core's.
func (a *App) config(addrs []caddy.NetworkAddress) (dnsproj.Config, error) {
	cfg := dnsproj.Config{
		Zone: a.Zone, Region: a.Region, TTL: time.Duration(a.TTL),
		MaxUDPSize: a.MaxUDPSize, MaxQuerySize: a.MaxQuerySize,
	}
	hosts := make([]string, len(addrs))
	for i, na := range addrs {
		hosts[i] = na.Host
	}
	var err error
	if cfg.NSAddrs, err = dnsproj.NSAddrs(a.NSAddresses, hosts); err != nil {
		return cfg, fmt.Errorf("ns address %w", err)
	}
	if f := a.Forward; f != nil {
		cfg.Forward = dnsproj.ForwardConfig{
			Upstreams: f.To, Policy: f.Policy, Timeout: time.Duration(f.Timeout),
			HealthCheck: time.Duration(f.HealthCheck), MaxFails: f.MaxFails,
		}
	}
	if c := a.Cache; c != nil {
		cfg.Cache = dnsproj.CacheConfig{
			Disabled: c.Disabled, Size: c.Size,
			MaxTTL: time.Duration(c.MaxTTL), MaxNegativeTTL: time.Duration(c.MaxNegativeTTL),
		}
	}
	return cfg, nil
}

func parseListen(listen []string) ([]caddy.NetworkAddress, error) {
	var out []caddy.NetworkAddress
	for _, l := range listen {
		na, err := caddy.ParseNetworkAddressWithDefaults(l, "udp", 1053)
		if err != nil {
			return nil, fmt.Errorf("parsing listen address %q: %w", l, err)
		}
		if na.Network != "udp" && na.Network != "tcp" && na.Network != "" {
			return nil, fmt.Errorf("listen address %q: give host:port; DNS is served over both UDP and TCP", l)
		}
		if na.PortRangeSize() != 1 {
			return nil, fmt.Errorf("listen address %q: one port, not a range", l)
		}
		out = append(out, na)
	}
	return out, nil
}

// Validate checks the config without I/O.
func (a *App) Validate() error { return a.validateAll() }

func (a *App) validateAll() error {
	listen := a.Listen
	if len(listen) == 0 {
		listen = []string{dnsproj.DefaultListen}
	}
	addrs, err := parseListen(listen)
	if err != nil {
		return err
	}
	cfg, err := a.config(addrs)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("validating dns config: %w", err)
	}
	return nil
}

// Start serves the listen addresses, taking the sockets over from the
// previous config when it served them too.
func (a *App) Start() error {
	for _, na := range a.addrs {
		pair, err := acquireSockets(na)
		if err != nil {
			return err
		}
		a.held = append(a.held, na)
		pc, ln := pair.serve()
		if err := a.srv.Serve(pc, ln); err != nil {
			pc.Close()
			ln.Close()
			return fmt.Errorf("serving dns on %s: %w", na, err)
		}
		a.logger.Info("serving dns", zap.String("address", na.JoinHostPort(0)), zap.String("zone", a.srv.Zone()),
			zap.String("region", a.Region), zap.String("region_from", a.regionFrom))
	}
	return nil
}

func listenAs[T any](na caddy.NetworkAddress) (T, error) {
	var zero T
	ln, err := na.Listen(context.Background(), 0, net.ListenConfig{})
	if err != nil {
		return zero, fmt.Errorf("listening for dns on %s: %w", na, err)
	}
	t, ok := ln.(T)
	if !ok {
		if c, ok := ln.(interface{ Close() error }); ok {
			c.Close()
		}
		return zero, fmt.Errorf("listening for dns on %s: got a %T", na, ln)
	}
	return t, nil
}

// Stop stops serving and releases the sockets (they stay open while the
// next config uses them). Errors are logged.
func (a *App) Stop() error {
	if a.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.srv.Close(ctx); err != nil {
		a.logger.Error("stopping dns server", zap.Error(err))
	}
	for _, na := range a.held {
		if err := releaseSockets(na); err != nil {
			a.logger.Error("releasing dns sockets", zap.String("address", na.JoinHostPort(0)), zap.Error(err))
		}
	}
	a.held = nil
	return nil
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Validator   = (*App)(nil)
)
