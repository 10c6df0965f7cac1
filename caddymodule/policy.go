package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/requestbody"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/rewrite"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Per-route policy (store.Route): a route's redirect, prefix stripping,
// header changes and body limit run as Caddy's own handlers
// (static_response, rewrite, headers, request_body), provisioned once per
// route of each immutable Service and memoised on it; its upstream
// timeouts are applied by the gateway's transport and its retries on
// chosen statuses around the proxy, which Caddy offers only for a whole
// handler.

// routePolicy is one route's policy, ready to serve.
type routePolicy struct {
	// pre run in order before the proxy; strip by matched prefix.
	pre   []caddyhttp.MiddlewareHandler
	strip map[string]caddyhttp.MiddlewareHandler
	// limit, when set, runs after strip, just before the proxy.
	limit *requestbody.RequestBody
	// redirect is set when pre holds the HTTPS redirect.
	redirect bool
	timeouts *routeTimeouts
	retries  *store.RouteRetries
	// err is why the policy could not be provisioned; its requests fail
	// with 502 and the error is logged once.
	err error
}

type policyMemo struct{ route int }

// policyOf returns the provisioned policy of m's route, or nil when the
// route has none.
func (h *Handler) policyOf(m projection.Match) *routePolicy {
	rt := m.RouteOf()
	if !rt.HasPolicy() {
		return nil
	}
	return m.Service.Memo(policyMemo{m.Route}, func(s *projection.Service) any {
		p, err := h.provisionPolicy(s.Namespace, rt)
		if err == nil {
			err = h.provisionRateLimit(p, s, m.Route, rt)
		}
		if err != nil {
			h.logger.Error("route policy unusable; its requests fail with 502",
				zap.String("service", s.Key()), zap.Int("route", m.Route), zap.Error(err))
			return &routePolicy{err: err}
		}
		return p
	}).(*routePolicy)
}

// provisionPolicy builds the handlers of rt's policy (a route of
// namespace ns).
func (h *Handler) provisionPolicy(ns string, rt *store.Route) (*routePolicy, error) {
	p := &routePolicy{retries: rt.Retries}
	if t := rt.Timeouts; t != nil && (t.Connect > 0 || t.ResponseHeader > 0) {
		p.timeouts = &routeTimeouts{connect: time.Duration(t.Connect), header: time.Duration(t.ResponseHeader)}
	}
	provision := func(m caddyhttp.MiddlewareHandler) error {
		if pr, ok := m.(caddy.Provisioner); ok {
			return pr.Provision(h.ctx)
		}
		return nil
	}
	if err := p.addIPFilter(rt, h); err != nil {
		return nil, err
	}
	if rt.RedirectHTTPS {
		p.redirect = true
		p.pre = append(p.pre, redirectHTTPS{resp: &caddyhttp.StaticResponse{
			StatusCode: caddyhttp.WeakString("308"),
			Headers:    http.Header{"Location": {"https://{http.request.hostport}{http.request.uri}"}},
		}})
	}
	if err := h.provisionAuth(ns, rt, p); err != nil {
		return nil, err
	}
	if rt.RequestHeaders != nil || rt.ResponseHeaders != nil {
		hh := &headers.Handler{}
		if o := rt.RequestHeaders; o != nil {
			hh.Request = headerOps(o)
		}
		if o := rt.ResponseHeaders; o != nil {
			hh.Response = &headers.RespHeaderOps{HeaderOps: headerOps(o), Deferred: true}
		}
		if err := provision(hh); err != nil {
			return nil, fmt.Errorf("headers: %w", err)
		}
		p.pre = append(p.pre, hh)
	}
	if rt.StripPrefix {
		p.strip = map[string]caddyhttp.MiddlewareHandler{}
		for _, pre := range rt.PathPrefixes {
			rw := &rewrite.Rewrite{StripPathPrefix: pre}
			if err := provision(rw); err != nil {
				return nil, fmt.Errorf("strip_prefix %s: %w", pre, err)
			}
			p.strip[pre] = rw
		}
	}
	if rt.MaxRequestBody != "" {
		n, err := store.ParseByteSize(rt.MaxRequestBody)
		if err != nil {
			return nil, fmt.Errorf("max_request_body: %w", err)
		}
		p.limit = &requestbody.RequestBody{MaxSize: n}
	}
	return p, nil
}

func headerOps(o *store.HeaderOps) *headers.HeaderOps {
	out := &headers.HeaderOps{Delete: o.Delete}
	if len(o.Set) > 0 {
		out.Set = http.Header{}
		for k, v := range o.Set {
			out.Set.Set(k, v)
		}
	}
	if len(o.Add) > 0 {
		out.Add = http.Header{}
		for k, v := range o.Add {
			out.Add.Add(k, v)
		}
	}
	return out
}

// redirects reports whether p answers r with a redirect, which needs no
// instance.
func (p *routePolicy) redirects(r *http.Request) bool {
	return p.err == nil && p.redirect && !viaHTTPS(r)
}

// redirectHTTPS answers a plain-HTTP request with its static response
// (the redirect); a request the client sent over HTTPS (to us, or to a
// trusted proxy: viaHTTPS) goes on.
type redirectHTTPS struct{ resp *caddyhttp.StaticResponse }

func (rd redirectHTTPS) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if viaHTTPS(r) {
		return next.ServeHTTP(w, r)
	}
	return rd.resp.ServeHTTP(w, r, next)
}

// policyRun runs one request through a policy's handlers, then the
// proxy: one allocation per request, no closure per handler. As a
// MiddlewareHandler it is the entry the traffic counters call; as a
// policyStep, the next handler each of the policy's handlers calls.
type policyRun struct {
	p        *routePolicy
	strip    caddyhttp.MiddlewareHandler
	proxy    caddyhttp.MiddlewareHandler
	next     caddyhttp.Handler
	pre      int
	stripped bool
	limited  bool
	// rw is the retry writer, kept here to cost no allocation of its own.
	rw retryWriter
}

// newPolicyRun prepares r's run through p; prefix is the route's path
// prefix r matched, proxy the reverse proxy.
func (p *routePolicy) newPolicyRun(prefix string, proxy caddyhttp.MiddlewareHandler) *policyRun {
	run := &policyRun{p: p, proxy: proxy}
	if p.strip != nil {
		run.strip = p.strip[prefix]
	}
	return run
}

func (c *policyRun) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if c.p.err != nil {
		return caddyhttp.Error(http.StatusBadGateway, c.p.err)
	}
	c.next = next
	return (*policyStep)(c).ServeHTTP(w, r)
}

type policyStep policyRun

func (c *policyStep) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if c.pre < len(c.p.pre) {
		c.pre++
		return c.p.pre[c.pre-1].ServeHTTP(w, r, c)
	}
	if c.strip != nil && !c.stripped {
		c.stripped = true
		return c.strip.ServeHTTP(w, r, c)
	}
	if c.p.limit != nil && !c.limited {
		c.limited = true
		return c.p.limit.ServeHTTP(w, r, c)
	}
	return c.p.proxy(w, r, c.proxy, c.next, &c.rw)
}

// varTimeouts is the request variable under which the policy leaves its
// timeouts for the transport.
const varTimeouts = "edgeplane.timeouts"

// proxy runs the reverse proxy for r: with the route's timeouts for the
// transport, retried on the route's statuses, and a body over the limit
// answered 413 even when it was streamed without a length.
func (p *routePolicy) proxy(w http.ResponseWriter, r *http.Request, proxy caddyhttp.MiddlewareHandler, next caddyhttp.Handler, rw *retryWriter) error {
	if p.timeouts != nil {
		caddyhttp.SetVar(r.Context(), varTimeouts, p.timeouts)
	}
	var over *overLimit
	if hasBody(r) && p.limit != nil {
		over = &overLimit{ReadCloser: r.Body}
		r.Body = over
	}
	var err error
	if p.retries != nil && retryable(r.Method) {
		err = p.retry(w, r, proxy, next, rw)
	} else {
		err = proxy.ServeHTTP(w, r, next)
	}
	if err != nil && over != nil && over.hit != nil {
		return caddyhttp.Error(http.StatusRequestEntityTooLarge, over.hit)
	}
	return err
}

// hasBody reports whether r came with a body (request_body wraps even an
// empty one, so the Body field does not say).
func hasBody(r *http.Request) bool {
	return r.ContentLength != 0 || len(r.TransferEncoding) > 0
}

// overLimit notes a body read that went past request_body's limit.
type overLimit struct {
	io.ReadCloser
	hit error
}

func (o *overLimit) Read(b []byte) (int, error) {
	n, err := o.ReadCloser.Read(b)
	var mbe *http.MaxBytesError
	if err != nil && errors.As(err, &mbe) {
		o.hit = err
	}
	return n, err
}

// retryable reports whether method is idempotent (RFC 9110 9.2.2).
func retryable(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// retry proxies r, and again (at most retries.Max times, the load
// balancer choosing an instance anew) while the answer is one of
// retries.OnStatus; the last answer goes to the client whatever it is. A
// body is kept to be sent again up to store.MaxRetryBody; a larger one is
// sent once.
func (p *routePolicy) retry(w http.ResponseWriter, r *http.Request, proxy caddyhttp.MiddlewareHandler, next caddyhttp.Handler, rw *retryWriter) error {
	var body []byte
	if hasBody(r) {
		b, err := io.ReadAll(io.LimitReader(r.Body, store.MaxRetryBody+1))
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
		}
		if len(b) > store.MaxRetryBody {
			r.Body = readCloser{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
			return proxy.ServeHTTP(w, r, next)
		}
		body = b
	}
	max := p.retries.Max
	if max <= 0 {
		max = 1
	}
	var mark headerMark
	mark.save(w.Header())
	for attempt := 0; ; attempt++ {
		if body != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		*rw = retryWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			retryOn: p.retries.OnStatus, last: attempt >= max}
		err := proxy.ServeHTTP(rw, r, next)
		if !rw.swallowed {
			return err
		}
		// Drop what the discarded answer put in the headers.
		mark.restore(w.Header())
	}
}

// headerMark remembers a header's fields to put it back as it was: a
// shallow copy is enough, since the proxy adds an answer's fields
// (appending past the saved slices' lengths) or replaces them whole,
// never edits a saved value in place. Up to 8 fields cost no allocation.
type headerMark struct {
	small [8]fieldMark
	n     int
	big   http.Header
}

type fieldMark struct {
	key  string
	vals []string
}

func (m *headerMark) save(h http.Header) {
	if len(h) > len(m.small) {
		m.big = maps.Clone(h)
		return
	}
	for k, v := range h {
		m.small[m.n] = fieldMark{k, v}
		m.n++
	}
}

func (m *headerMark) restore(h http.Header) {
	clear(h)
	if m.big != nil {
		maps.Copy(h, m.big)
		return
	}
	for _, f := range m.small[:m.n] {
		h[f.key] = f.vals
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// retryWriter swallows an answer with a status to retry on, unless it
// is the last attempt.
type retryWriter struct {
	caddyhttp.ResponseWriterWrapper
	retryOn   []int
	last      bool
	swallowed bool
}

func (w *retryWriter) WriteHeader(code int) {
	if !w.last && code >= 200 && slices.Contains(w.retryOn, code) {
		w.swallowed = true
		return
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

func (w *retryWriter) Write(b []byte) (int, error) {
	if w.swallowed {
		return len(b), nil
	}
	return w.ResponseWriterWrapper.Write(b)
}

func (w *retryWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.swallowed {
		return io.Copy(io.Discard, r)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError is what http.ResponseController calls before unwrapping: a
// swallowed answer must not reach the client through a flush.
func (w *retryWriter) FlushError() error {
	if w.swallowed {
		return nil
	}
	return http.NewResponseController(w.ResponseWriterWrapper.ResponseWriter).Flush()
}

func (w *retryWriter) Flush() { _ = w.FlushError() }

// routeTimeouts are a route's upstream timeouts; zero is the gateway's
// own. The gateway's transport keeps one HTTP transport per distinct pair
// (timedTransport), so a request pays no timer of its own.
type routeTimeouts struct {
	connect, header time.Duration
}
