package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/projection"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// varService is the request variable under which the handler leaves the
// routed *projection.Service for the upstream source.
const varService = "edgeplane.service"

// Handler is `http.handlers.edgeplane`: it routes a request by its host
// (exact or "*.suffix") and path prefix to its service's routable instances
// through Caddy's own reverse proxy. Every reverse_proxy option
// (load_balancing, health_checks, transport, headers, flush_interval, ...)
// is accepted inline and keeps its meaning; the upstreams always come from
// the projection, so `upstreams` and `dynamic_upstreams` must be empty.
//
// An unknown host or path gets 404 "no route for this host"; a routed
// service without routable instances gets 503. Neither names any internal
// detail.
type Handler struct {
	reverseproxy.Handler

	app    *App
	ctx    caddy.Context
	logger *zap.Logger
	// proxyReady is set once the embedded proxy is provisioned; Cleanup
	// after a failed Provision must not touch it.
	proxyReady bool
	// auths are the routes' authentication handlers (policy_auth.go).
	auths *authHandlers
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.edgeplane",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the embedded reverse proxy with the projection as its
// dynamic upstream source.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.ctx, h.logger = ctx, ctx.Logger()
	h.auths = &authHandlers{}
	if len(h.Upstreams) > 0 || h.DynamicUpstreamsRaw != nil {
		return fmt.Errorf("provisioning edgeplane handler: upstreams come from the routing projection; remove upstreams and dynamic_upstreams")
	}
	app, err := edgeplaneApp(ctx)
	if err != nil {
		return fmt.Errorf("provisioning edgeplane handler: %w", err)
	}
	h.app = app
	raw, err := json.Marshal(map[string]string{"source": "edgeplane"})
	if err != nil {
		return err
	}
	h.DynamicUpstreamsRaw = raw
	if err := h.Handler.Provision(ctx); err != nil {
		return fmt.Errorf("provisioning edgeplane handler's reverse proxy: %w", err)
	}
	h.proxyReady = true
	if ht, ok := h.Transport.(*reverseproxy.HTTPTransport); ok {
		h.Transport = &gatewayTransport{HTTPTransport: ht, health: app.health, app: app}
	}
	return nil
}

// Cleanup releases the reverse proxy's resources.
func (h *Handler) Cleanup() error {
	h.auths.cleanup()
	if !h.proxyReady {
		return nil
	}
	if gt, ok := h.Transport.(*gatewayTransport); ok {
		gt.closeTimed()
	}
	return h.Handler.Cleanup()
}

// ServeHTTP routes the request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	markDraining(w)
	v := h.app.Projection().View()
	m, ok := v.LookupRoute(r.Host, r.URL.Path)
	svc := m.Service
	if !ok {
		if c := h.logger.Check(zapcore.DebugLevel, "no route"); c != nil {
			c.Write(zap.String("host", r.Host), zap.String("path", r.URL.Path))
		}
		return plainError(w, http.StatusNotFound, "no route for this host\n")
	}
	if rec, on := v.Maintenance(svc.Namespace, svc.Name); on {
		return serveMaintenance(w, r, rec, m.RouteOf())
	}
	if pages := m.RouteOf().ErrorPages; len(pages) > 0 {
		return h.serveErrorPages(w, r, next, v, m, pages)
	}
	return h.serveRoute(w, r, next, v, m)
}

// serveRoute serves r, which matched m in v: the service's policy, then
// its instances.
func (h *Handler) serveRoute(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, v *projection.View, m projection.Match) error {
	svc := m.Service
	p := h.policyOf(m)
	if len(svc.Endpoints) == 0 && (p == nil || !p.redirects(r)) {
		return plainError(w, http.StatusServiceUnavailable, "service unavailable\n")
	}
	if home := h.app.home(v); home.regional && !featuresOff.locality.Load() {
		if lp := h.app.plan(v, home, svc); lp.unavailable != "" && (p == nil || !p.redirects(r)) {
			w.Header().Set("Edgeplane-Reason", lp.reason)
			return plainError(w, http.StatusServiceUnavailable, lp.unavailable)
		}
	}
	caddyhttp.SetVar(r.Context(), varService, svc)
	counters := h.app.shared.traffic.of(svc)
	side, counted := unsplit, unsplit
	if svc.Split != nil {
		var byCookie bool
		side, byCookie = pickSide(w, r, svc, h.app.shared.canaryKey())
		caddyhttp.SetVar(r.Context(), varSide, side)
		// A side the client's cookie chose counts in the canary's
		// figures only up to one client's share (admitCanary).
		if counted = side; byCookie && !counters.admitCanary(r) {
			counted = unsplit
		}
	}
	var proxy caddyhttp.MiddlewareHandler = &h.Handler
	if p != nil {
		proxy = p.newPolicyRun(m.Prefix, proxy)
	}
	if featuresOff.traffic.Load() {
		return proxy.ServeHTTP(w, r, next)
	}
	return counters.serve(w, r, proxy, next, counted, h.app.accessRequestOf(w, r, m))
}

func plainError(w http.ResponseWriter, code int, body string) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, err := w.Write([]byte(body))
	return err
}

// edgeplaneApp returns the config's edgeplane app, loading it with its
// defaults if the config does not name it.
func edgeplaneApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("edgeplane")
	if err != nil {
		return nil, fmt.Errorf("getting the edgeplane app: %w", err)
	}
	return v.(*App), nil
}

// serviceFor is the service routed for r, as the handler decided it, or
// looked up afresh when the upstream source is used on its own.
func serviceFor(v *projection.View, r *http.Request) (*projection.Service, bool) {
	if s, ok := caddyhttp.GetVar(r.Context(), varService).(*projection.Service); ok && s != nil {
		return s, true
	}
	return v.Lookup(r.Host, r.URL.Path)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
