package caddymodule

import (
	"context"
	"net"
	"net/http"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// gatewayTransport is Caddy's HTTP transport with each round trip bounded
// by its route's timeouts and, with health checks on, registered with the
// health checker until its response headers arrive, so that one waiting on
// an endpoint found failing is abandoned for a retry. Embedding keeps
// every optional interface the proxy asks the transport for (TLS, h2c,
// PROXY protocol, health-check scheme).
type gatewayTransport struct {
	*reverseproxy.HTTPTransport
	health *healthChecker
	// app counts the requests by region.
	app *App
	// timed holds a clone of the HTTP transport per distinct route
	// timeouts (routeTimeouts -> *http.Transport).
	timed sync.Map
}

// RoundTrip sends req on, abandoning it if its endpoint fails a probe
// before the response headers arrive, and counts a request that reached
// its endpoint under the endpoint's region.
func (t *gatewayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	di, ok := reverseproxy.GetDialInfo(req.Context())
	if !ok {
		return t.send(req)
	}
	resp, err := t.sendWatched(req, di.Address)
	if err == nil && t.app != nil {
		t.app.countRegion(req, di.Address)
	}
	return resp, err
}

// sendWatched sends req to addr registered with the health checker. The
// context that needs lives on with the response body once the headers
// are in: it ends with the request.
func (t *gatewayTransport) sendWatched(req *http.Request, addr string) (*http.Response, error) {
	if t.health == nil || featuresOff.abandon.Load() {
		return t.send(req)
	}
	ctx, abandon := context.WithCancelCause(req.Context())
	w := t.health.waiting.add(addr, abandon)
	defer t.health.waiting.remove(addr, w)
	return t.send(req.WithContext(ctx))
}

// send sends req through the HTTP transport, or its clone with the
// timeouts of req's route. (An HTTP/3 upstream transport has no clone:
// route timeouts do not apply to it.)
func (t *gatewayTransport) send(req *http.Request) (*http.Response, error) {
	tm, ok := caddyhttp.GetVar(req.Context(), varTimeouts).(*routeTimeouts)
	if !ok || slices.Contains(t.Versions, "3") {
		return t.HTTPTransport.RoundTrip(req)
	}
	tr := t.timedTransport(*tm)
	t.HTTPTransport.SetScheme(req)
	return tr.RoundTrip(req)
}

// timedTransport returns the round trip of a clone of the HTTP transport
// with tm's timeouts: ResponseHeaderTimeout, and each dial bounded by the
// connect timeout (still a dial error, which the proxy retries elsewhere).
// Clones share nothing but configuration: each keeps its own idle
// connections.
func (t *gatewayTransport) timedTransport(tm routeTimeouts) *http.Transport {
	v, ok := t.timed.Load(tm)
	if !ok {
		tr := t.HTTPTransport.Transport.Clone()
		if tm.header > 0 {
			tr.ResponseHeaderTimeout = tm.header
		}
		if dial := tr.DialContext; tm.connect > 0 && dial != nil {
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, tm.connect)
				defer cancel()
				return dial(ctx, network, addr)
			}
		}
		v, _ = t.timed.LoadOrStore(tm, tr)
	}
	return v.(*http.Transport)
}

// closeTimed closes the idle connections of every timed clone.
func (t *gatewayTransport) closeTimed() {
	t.timed.Range(func(_, v any) bool {
		v.(*http.Transport).CloseIdleConnections()
		return true
	})
}
