package caddymodule

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/rewrite"

	"github.com/edgeplane/edgeplane/store"
)

// A route's authentication runs as Caddy's own handlers: basic_auth is
// the `authentication` handler with the http_basic provider (its hash
// module compares in constant time; its hash_cache keeps a verified
// password from costing a bcrypt or argon2id per request), forward_auth
// a reverse proxy to the auth service built as Caddy's `forward_auth`
// directive builds it (GET, the asked uri, X-Forwarded-Method and -Uri;
// a 2xx answer copies the named headers onto the request and goes on,
// any other is the client's). An auth service that cannot be asked
// answers 503: never an open door.
//
// The handlers are kept per distinct configuration for the gateway
// handler's life, not per route of each Service: a routing change
// replaces a Service, and an auth proxy made anew with it would leave its
// connection pool behind, a hash cache made anew would forget every
// verified password. They are cleaned up with the handler.

// DefaultForwardAuthTimeout bounds an ask of the auth service when the
// route sets no timeout.
const DefaultForwardAuthTimeout = 5 * time.Second

// basicAuthHashCache turns Caddy's hash_cache on for basic_auth; only
// the benchmark turns it off, to measure what it saves.
var basicAuthHashCache = true

// authHandlers are the gateway handler's authentication handlers, by
// their configuration.
type authHandlers struct {
	mu    sync.Mutex
	byKey map[string]caddyhttp.MiddlewareHandler
}

// get returns the handler made for key, making it with mk the first time.
func (a *authHandlers) get(key string, mk func() (caddyhttp.MiddlewareHandler, error)) (caddyhttp.MiddlewareHandler, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.byKey[key]; ok {
		return m, nil
	}
	m, err := mk()
	if err != nil {
		return nil, err
	}
	if a.byKey == nil {
		a.byKey = map[string]caddyhttp.MiddlewareHandler{}
	}
	a.byKey[key] = m
	return m, nil
}

// cleanup releases every handler's resources (the auth proxies' upstreams
// and connections).
func (a *authHandlers) cleanup() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.byKey {
		if c, ok := m.(caddy.CleanerUpper); ok {
			_ = c.Cleanup()
		}
	}
	a.byKey = nil
}

// provisionAuth adds rt's basic_auth and forward_auth to p's handlers;
// ns is the route's namespace, where a forward_auth service is.
func (h *Handler) provisionAuth(ns string, rt *store.Route, p *routePolicy) error {
	if ba := rt.BasicAuth; ba != nil {
		key, _ := json.Marshal(ba)
		m, err := h.auths.get("basic_auth "+string(key), func() (caddyhttp.MiddlewareHandler, error) { return h.basicAuth(ba) })
		if err != nil {
			return fmt.Errorf("basic_auth: %w", err)
		}
		p.pre = append(p.pre, m)
	}
	if fa := rt.ForwardAuth; fa != nil {
		key, _ := json.Marshal(fa)
		m, err := h.auths.get("forward_auth "+ns+" "+string(key), func() (caddyhttp.MiddlewareHandler, error) { return h.forwardAuth(ns, fa) })
		if err != nil {
			return fmt.Errorf("forward_auth: %w", err)
		}
		p.pre = append(p.pre, m)
	}
	return nil
}

// basicAuth builds Caddy's authentication handler for ba. The manifest
// refuses users hashing with different algorithms (http_basic takes
// one); a user whose hash is no algorithm's is refused here too, never
// served open.
func (h *Handler) basicAuth(ba *store.BasicAuth) (caddyhttp.MiddlewareHandler, error) {
	if len(ba.Users) == 0 {
		return nil, fmt.Errorf("no users")
	}
	kind := store.PasswordHashKind(ba.Users[0].Hash)
	accounts := make([]caddyauth.Account, len(ba.Users))
	for i, u := range ba.Users {
		if k := store.PasswordHashKind(u.Hash); k == "" || k != kind {
			return nil, fmt.Errorf("user %q: hash is not a %s hash like the route's first user's", u.Username, kind)
		}
		accounts[i] = caddyauth.Account{Username: u.Username, Password: u.Hash}
	}
	prov := caddyauth.HTTPBasicAuth{
		HashRaw:     caddyconfig.JSONModuleObject(struct{}{}, "algorithm", kind, nil),
		AccountList: accounts,
		Realm:       ba.Realm,
	}
	if basicAuthHashCache {
		prov.HashCache = &caddyauth.Cache{}
	}
	raw, err := json.Marshal(prov)
	if err != nil {
		return nil, err
	}
	a := &caddyauth.Authentication{ProvidersRaw: caddy.ModuleMap{"http_basic": raw}}
	if err := a.Provision(h.ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// forwardAuth builds the reverse proxy that asks fa's auth service, as
// Caddy's forward_auth directive does, and wraps it so that an auth
// service that cannot be asked answers 503.
func (h *Handler) forwardAuth(ns string, fa *store.ForwardAuth) (caddyhttp.MiddlewareHandler, error) {
	timeout := time.Duration(fa.Timeout)
	if timeout <= 0 {
		timeout = DefaultForwardAuthTimeout
	}
	transport := map[string]any{"protocol": "http", "dial_timeout": timeout, "response_header_timeout": timeout}
	uri := fa.URI
	if uri == "" {
		uri = "/"
	}
	rp := &reverseproxy.Handler{
		Headers: &headers.Handler{Request: &headers.HeaderOps{Set: http.Header{
			"X-Forwarded-Method": {"{http.request.method}"},
			"X-Forwarded-Uri":    {"{http.request.uri}"},
		}}},
		// GET sends no body, which leaves it to the service's proxy. A
		// uri without a query keeps the request's (Caddy's rewrite).
		Rewrite:        &rewrite.Rewrite{Method: http.MethodGet, URI: uri},
		HandleResponse: []caddyhttp.ResponseHandler{copyOn2xx(fa.CopyHeaders)},
	}
	if fa.URL != "" {
		u, err := url.Parse(fa.URL)
		if err != nil {
			return nil, fmt.Errorf("url: %w", err)
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if u.Scheme == "https" {
			transport["tls"] = map[string]any{"server_name": u.Hostname()}
		}
		rp.Upstreams = reverseproxy.UpstreamPool{{Dial: net.JoinHostPort(u.Hostname(), port)}}
	} else {
		src, err := json.Marshal(map[string]string{"source": "edgeplane", "namespace": ns, "service": fa.Service})
		if err != nil {
			return nil, err
		}
		rp.DynamicUpstreamsRaw = src
	}
	raw, err := json.Marshal(transport)
	if err != nil {
		return nil, err
	}
	rp.TransportRaw = raw
	if err := rp.Provision(h.ctx); err != nil {
		_ = rp.Cleanup()
		return nil, err
	}
	return &forwardAuth{rp: rp}, nil
}

// copyOn2xx is the handle_response entry of a 2xx answer: each header
// named is deleted from the request (a client may not bring its own) and
// set from the answer when the answer has it; then the request goes on
// (the routes end without a terminal handler). As Caddy's forward_auth.
func copyOn2xx(names []string) caddyhttp.ResponseHandler {
	routes := caddyhttp.RouteList{{HandlersRaw: []json.RawMessage{
		caddyconfig.JSONModuleObject(&caddyhttp.VarsMiddleware{}, "handler", "vars", nil)}}}
	for _, n := range slices.Sorted(slices.Values(names)) {
		n = http.CanonicalHeaderKey(n)
		ph := "{http.reverse_proxy.header." + n + "}"
		routes = append(routes, caddyhttp.Route{HandlersRaw: []json.RawMessage{caddyconfig.JSONModuleObject(
			&headers.Handler{Request: &headers.HeaderOps{Delete: []string{n}}}, "handler", "headers", nil)}})
		notEmpty, _ := json.Marshal([]map[string]any{{"vars": map[string][]string{ph: {""}}}})
		routes = append(routes, caddyhttp.Route{
			MatcherSetsRaw: []caddy.ModuleMap{{"not": notEmpty}},
			HandlersRaw: []json.RawMessage{caddyconfig.JSONModuleObject(
				&headers.Handler{Request: &headers.HeaderOps{Set: http.Header{n: {ph}}}}, "handler", "headers", nil)},
		})
	}
	return caddyhttp.ResponseHandler{Match: &caddyhttp.ResponseMatcher{StatusCode: []int{2}}, Routes: routes}
}

// forwardAuth asks the auth service, and tells an auth service that
// answered (whatever it said) from one that could not be asked: only the
// latter's error is turned into a 503, since an error once the request
// went on is the service's own.
type forwardAuth struct{ rp *reverseproxy.Handler }

func (fa *forwardAuth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	on := &authedNext{next: next}
	err := fa.rp.ServeHTTP(w, r, on)
	if err != nil && !on.called {
		// The proxy's own status (502, 504) would say the service failed:
		// it is the auth service that did, and the request was refused.
		he := caddyhttp.Error(http.StatusServiceUnavailable, err)
		he.StatusCode, he.Err = http.StatusServiceUnavailable, fmt.Errorf("asking the auth service: %w", he.Err)
		return he
	}
	return err
}

// Cleanup releases the auth proxy's upstreams and connections.
func (fa *forwardAuth) Cleanup() error { return fa.rp.Cleanup() }

// authedNext is the handler after a forward_auth, noting that the auth
// service let the request through.
type authedNext struct {
	next   caddyhttp.Handler
	called bool
}

func (n *authedNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	n.called = true
	return n.next.ServeHTTP(w, r)
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*forwardAuth)(nil)
	_ caddy.CleanerUpper          = (*forwardAuth)(nil)
)
