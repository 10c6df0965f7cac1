package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// The gateway's layer-4 ports. One port manager per shared projection
// follows the routing view and opens one caddy-l4 server per gateway port
// the view routes (View.Layer4().Ports()), bound through Caddy's listener
// pool, and closes it when no service exposes the port any more: no
// Caddy reload, and a port closed stops accepting while its established
// connections go on (their drain follows the instances, not the port).
// Since it lives with the projection, a config reload keeps every port
// (and connection) the new config keeps; it reads layer4_bind and
// disable_layer4 from the app serving now. A port that cannot be bound
// is retried every l4RetryInterval and reported in the gateway's
// observation (L4Errors), as is a port the gateway's own HTTP servers
// listen on, which is never opened.

// l4RetryInterval is how often a port that could not be bound is tried
// again.
const l4RetryInterval = 3 * time.Second

// l4Tick is how often the manager looks at retries and drain deadlines
// between routing changes.
const l4Tick = 250 * time.Millisecond

// openPort is one caddy-l4 server for one gateway port.
type openPort struct {
	app    *layer4.App
	cancel context.CancelFunc
	bind   string
	svc    string
}

// portFailure is a port the manager could not open.
type portFailure struct {
	err   store.L4PortError
	retry time.Time
}

// l4Ports opens and closes the gateway's layer-4 ports.
type l4Ports struct {
	s      *sharedProjection
	logger *zap.Logger

	// wake asks for a sync now (a config started).
	wake chan struct{}

	mu     sync.Mutex
	open   map[store.PortKey]*openPort
	failed map[store.PortKey]*portFailure
}

func newL4Ports(s *sharedProjection, logger *zap.Logger) *l4Ports {
	return &l4Ports{s: s, logger: logger, wake: make(chan struct{}, 1), open: map[store.PortKey]*openPort{}, failed: map[store.PortKey]*portFailure{}}
}

// run follows the view until ctx ends, then closes every port.
func (m *l4Ports) run(ctx context.Context) {
	t := time.NewTicker(l4Tick)
	defer t.Stop()
	defer m.closeAll()
	for {
		changed := m.s.proj.Changed()
		m.sync(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-m.wake:
		case <-t.C:
		}
	}
}

// poke asks for a sync now.
func (m *l4Ports) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// sync brings the open ports to what the view and the serving app ask,
// and moves the drains along.
func (m *l4Ports) sync(now time.Time) {
	v := m.s.proj.View()
	report := m.s.l4.sweep(v, now)
	if app := m.s.app.Load(); app != nil {
		report = m.syncPorts(v, app, now) || report
	}
	if report {
		m.s.proj.Report()
	}
}

// syncPorts opens and closes ports; it reports whether the port errors
// changed.
func (m *l4Ports) syncPorts(v *projection.View, app *App, now time.Time) (changed bool) {
	want := map[store.PortKey]*projection.Service{}
	if !app.DisableLayer4 {
		for _, e := range v.Layer4().Ports() {
			want[e.PortKey] = e.Service
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, p := range m.open {
		if svc, ok := want[k]; !ok || p.bind != app.Layer4Bind {
			m.closePort(k, p)
		} else {
			p.svc = svc.Key()
		}
	}
	for k := range m.failed {
		if _, ok := want[k]; !ok {
			delete(m.failed, k)
			changed = true
		}
	}
	for k, svc := range want {
		if _, ok := m.open[k]; ok {
			continue
		}
		f := m.failed[k]
		if slices.Contains(app.ownPorts, k) {
			if f == nil {
				changed = true
				m.failed[k] = &portFailure{err: store.L4PortError{Port: k.String(), Namespace: svc.Namespace, Service: svc.Name,
					Error: "the gateway's own HTTP server listens on this port", Since: now.UTC()}}
			}
			continue
		}
		if f != nil && now.Before(f.retry) {
			continue
		}
		p, err := m.openPort(k, app)
		if err == nil {
			p.svc = svc.Key()
			m.open[k] = p
			if f != nil {
				changed = true
				delete(m.failed, k)
				m.logger.Info("layer-4 port opened after failing", zap.String("port", k.String()))
			}
			continue
		}
		if f == nil {
			changed = true
			f = &portFailure{err: store.L4PortError{Port: k.String(), Since: now.UTC()}}
			m.failed[k] = f
			m.logger.Warn("could not open layer-4 port; retrying", zap.String("port", k.String()), zap.String("service", svc.Key()), zap.Error(err))
		}
		changed = changed || f.err.Error != err.Error()
		f.err.Namespace, f.err.Service, f.err.Error = svc.Namespace, svc.Name, err.Error()
		f.retry = now.Add(l4RetryInterval)
	}
	return changed
}

// openPort provisions and starts a caddy-l4 server for k on app's
// layer4_bind, in a context of its own that carries the shared projection
// to the handler. The context has app's config (its logging) but not its
// lifetime: the port outlives a reload.
func (m *l4Ports) openPort(k store.PortKey, app *App) (*openPort, error) {
	bind := app.Layer4Bind
	handler, err := json.Marshal(map[string]string{"handler": "edgeplane", "port": k.String()})
	if err != nil {
		return nil, err
	}
	srv := &layer4.Server{
		Listen: []string{k.Proto + "/" + net.JoinHostPort(bind, strconv.Itoa(k.Port))},
		Routes: layer4.RouteList{{HandlersRaw: []json.RawMessage{handler}}},
	}
	l4 := &layer4.App{Servers: map[string]*layer4.Server{k.String(): srv}}
	base := app.ctx
	base.Context = context.WithValue(context.Background(), sharedKey{}, m.s)
	ctx, cancel := caddy.NewContext(base)
	if err := l4.Provision(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("provisioning layer-4 server for %s: %w", k, err)
	}
	if err := l4.Start(); err != nil {
		cancel()
		return nil, err
	}
	m.logger.Info("layer-4 port opened", zap.String("port", k.String()), zap.String("bind", bind))
	return &openPort{app: l4, cancel: cancel, bind: bind}, nil
}

// closePort stops accepting on k; established connections go on.
func (m *l4Ports) closePort(k store.PortKey, p *openPort) {
	if err := p.app.Stop(); err != nil {
		m.logger.Warn("closing layer-4 port", zap.String("port", k.String()), zap.Error(err))
	}
	p.cancel()
	delete(m.open, k)
	m.logger.Info("layer-4 port closed", zap.String("port", k.String()))
}

func (m *l4Ports) closeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, p := range m.open {
		m.closePort(k, p)
	}
	clear(m.failed)
}

// errors lists the ports the gateway could not open, by port.
func (m *l4Ports) errors() []store.L4PortError {
	m.mu.Lock()
	out := make([]store.L4PortError, 0, len(m.failed))
	for _, f := range m.failed {
		out = append(out, f.err)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b store.L4PortError) int {
		ka, _ := store.ParsePortKey(a.Port)
		kb, _ := store.ParsePortKey(b.Port)
		return ka.Compare(kb)
	})
	if len(out) > store.MaxL4Reported {
		out = out[:store.MaxL4Reported]
	}
	return out
}

// openPorts maps each open port to its service.
func (m *l4Ports) openPorts() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.open))
	for k, p := range m.open {
		out[k.String()] = p.svc
	}
	return out
}

// ownPortsOf lists the ports the config's HTTP servers listen on (TCP,
// and UDP for HTTP/3): a layer-4 server on one of them would share the
// listener through Caddy's pool, so they are never opened.
func ownPortsOf(ctx caddy.Context) []store.PortKey {
	v, err := ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	app, ok := v.(*caddyhttp.App)
	if !ok {
		return nil
	}
	var out []store.PortKey
	for _, srv := range app.Servers {
		for _, l := range srv.Listen {
			na, err := caddy.ParseNetworkAddress(l)
			if err != nil || na.IsUnixNetwork() {
				continue
			}
			for p := na.StartPort; p <= na.EndPort && p > 0; p++ {
				out = append(out, store.PortKey{Proto: store.ProtoTCP, Port: int(p)}, store.PortKey{Proto: store.ProtoUDP, Port: int(p)})
			}
		}
	}
	return out
}

// l4Observation is what the gateway's observation says of layer 4 as
// of view v: the instances draining and the ports it could not open.
func (s *sharedProjection) l4Observation(v *projection.View) ([]store.L4Drain, []store.L4PortError) {
	return s.l4.draining(v, time.Now()), s.ports.errors()
}

// L4EntryInfo is one layer-4 entry of a service in /edgeplane/routes.
type L4EntryInfo struct {
	// Entry is a gateway port ("tcp/5432") or a passthrough host
	// ("tls/db.example.com").
	Entry string `json:"entry"`
	// Open maps each instance of the service to the connections open to
	// it (through any of its entries).
	Open map[string]int `json:"open,omitempty"`
	// Error is why the gateway could not open the port, if so.
	Error string `json:"error,omitempty"`
}

// l4Info lists s's layer-4 entries under v.
func l4Info(app *App, v *projection.View, s *projection.Service) []L4EntryInfo {
	if s.Layer4.Empty() {
		return nil
	}
	x := v.Layer4()
	open := app.shared.l4.openTo(s.Key())
	errs := map[string]string{}
	for _, e := range app.shared.ports.errors() {
		errs[e.Port] = e.Error
	}
	var out []L4EntryInfo
	for _, e := range x.Ports() {
		if e.Service == s {
			out = append(out, L4EntryInfo{Entry: e.String(), Open: open, Error: errs[e.String()]})
		}
	}
	for _, h := range x.PassthroughHosts() {
		if h.Service == s {
			out = append(out, L4EntryInfo{Entry: "tls/" + h.Host, Open: open})
		}
	}
	return out
}

// udpOnly says s is reached only over UDP (no HTTP route, readiness path,
// TCP port or passthrough host): the health checker's TCP connect would
// find nothing listening, so its endpoints are not probed.
func udpOnly(s *projection.Service) bool {
	return len(s.Layer4.UDP) > 0 && len(s.Layer4.TCP) == 0 && len(s.Layer4.PassthroughHosts()) == 0 &&
		s.HealthPath == "" && len(s.Routes) == 0
}
