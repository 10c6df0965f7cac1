package caddymodule

import (
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Access lines and request IDs. Every routed request gets an X-Request-ID
// and a W3C traceparent before the proxy (the client's own when sane),
// and the response carries the request ID back. When the request ends,
// the traffic counters' wrapper (serviceCounters.serve) hands its status,
// bytes and duration here: one JSON line through the zap logger
// "edgeplane.access" (Caddy's logging config can send it to a file), and,
// sampled to at most App.AccessLogRate lines a second per service, the
// same line as a store.AccessLine on Names.AccessSubject for `control logs
// --access`. A line never carries the query string or a request header
// unless the route's access_log names it.

// DefaultAccessLogRate is how many access lines a second of one service
// a gateway publishes at most.
const DefaultAccessLogRate = 100

// The canonical keys (X-Request-ID's is X-Request-Id), for direct map
// access that costs no canonicalising.
const (
	headerRequestID   = "X-Request-Id"
	headerTraceparent = "Traceparent"
	// maxRequestID is the longest client request ID passed through.
	maxRequestID = 128
)

// accessLog is the app's access logging: nil when the gateway turned it
// off.
type accessLog struct {
	logger  *zap.Logger
	gateway string
	// rate is the most lines a second per service published; 0 publishes
	// none.
	rate int64
	// conn is the store connection lines are published on (the
	// projection's), nil while there is none.
	conn func() *store.Store
}

// newAccessLog is a's access logging, nil when a turned it off.
func newAccessLog(a *App) *accessLog {
	if a.DisableAccessLog {
		return nil
	}
	rate := int64(DefaultAccessLogRate)
	if a.AccessLogRate != nil {
		rate = int64(*a.AccessLogRate)
	}
	return &accessLog{logger: a.logger.Named("access"), gateway: a.GatewayName, rate: rate, conn: a.shared.conn}
}

// accessRequest is what one request's access line needs beyond its
// counters: passed by value, it costs the request no allocation.
type accessRequest struct {
	log    *accessLog
	svc    *projection.Service
	route  int
	policy *store.AccessLogPolicy
	id     string
	// path and query are the request's as the client sent them, before
	// the route's policy rewrites them (strip_prefix).
	path, query string
}

// accessRequestOf is r's access request for m's route, with its request
// ID set; a zero accessRequest (nothing logged) when the gateway or the
// route turned logging off. Request IDs are set either way: they reach
// the instance even when nothing is logged here.
func (a *App) accessRequestOf(w http.ResponseWriter, r *http.Request, m projection.Match) accessRequest {
	var id string
	if !featuresOff.requestIDs.Load() {
		id = setRequestIDs(w, r)
	}
	rt := m.RouteOf()
	if a.access == nil || (rt.AccessLog != nil && rt.AccessLog.Off) {
		return accessRequest{}
	}
	return accessRequest{log: a.access, svc: m.Service, route: m.Route, policy: rt.AccessLog, id: id, path: r.URL.Path, query: r.URL.RawQuery}
}

// setRequestIDs gives r a sane X-Request-ID and a valid traceparent,
// keeping the client's own, and returns the request ID, which the
// response carries back.
func setRequestIDs(w http.ResponseWriter, r *http.Request) string {
	id := headerValue(r.Header, headerRequestID)
	newID, newTrace := !saneRequestID(id), !validTraceparent(headerValue(r.Header, headerTraceparent))
	if newID || newTrace {
		// What is made is made in one string and one value slice, which
		// the headers share: a header's values are replaced, never
		// changed in place, and a one-element slice grows into a new one.
		var b [requestIDLen + traceparentLen]byte
		if newID {
			fillRequestID(b[:requestIDLen])
		}
		if newTrace {
			fillTraceparent(b[requestIDLen:])
		}
		made, vals := string(b[:]), make([]string, 2)
		if newID {
			id, vals[0] = made[:requestIDLen], made[:requestIDLen]
			r.Header[headerRequestID] = vals[0:1:1]
		}
		if newTrace {
			vals[1] = made[requestIDLen:]
			r.Header[headerTraceparent] = vals[1:2:2]
		}
	}
	// The response carries the request's own value slice (see above).
	w.Header()[headerRequestID] = r.Header[headerRequestID]
	return id
}

// headerValue is h's only value of the canonical key k; "" when it has
// none or several (several IDs name no one request).
func headerValue(h http.Header, k string) string {
	if v := h[k]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// saneRequestID reports whether id may pass through and be logged: up to
// maxRequestID characters of letters, digits and -_.:+/=@ (nothing that
// would need escaping in a log or a header).
func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '_', c == '.', c == ':', c == '+', c == '/', c == '=', c == '@':
		default:
			return false
		}
	}
	return true
}

// The lengths of a request ID the gateway makes and of a traceparent.
const (
	requestIDLen   = 32
	traceparentLen = 55
)

// fillRequestID fills dst (requestIDLen bytes) with a new request ID: 16
// random bytes in hex. math/rand/v2's generator (ChaCha8 per thread) is
// fast, lock-free and unpredictable enough for an ID that is no secret.
func fillRequestID(dst []byte) { randomHex(dst) }

// newTraceparent starts a new trace (version 00, not sampled: the
// gateway records no spans).
func newTraceparent() string {
	var b [traceparentLen]byte
	fillTraceparent(b[:])
	return string(b[:])
}

// fillTraceparent fills dst (traceparentLen bytes) with a new
// traceparent.
func fillTraceparent(b []byte) {
	copy(b, "00-")
	randomHex(b[3:35])
	b[35] = '-'
	randomHex(b[36:52])
	copy(b[52:], "-00")
}

// randomHex fills dst (an even length) with random hex digits.
func randomHex(dst []byte) {
	var raw [8]byte
	for len(dst) > 0 {
		u := rand.Uint64()
		for i := range raw {
			raw[i] = byte(u >> (8 * i))
		}
		n := min(len(dst)/2, len(raw))
		hex.Encode(dst, raw[:n])
		dst = dst[2*n:]
	}
}

// validTraceparent checks a W3C traceparent: version-traceid-parentid-
// flags in lower-case hex, the IDs not all zero, version ff invalid; a
// future version may carry more after the flags.
func validTraceparent(tp string) bool {
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	if tp[:2] == "ff" || (tp[:2] == "00" && len(tp) != 55) || (len(tp) > 55 && tp[55] != '-') {
		return false
	}
	for _, part := range [4]string{tp[:2], tp[3:35], tp[36:52], tp[53:55]} {
		for i := 0; i < len(part); i++ {
			if c := part[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return tp[3:35] != "00000000000000000000000000000000" && tp[36:52] != "0000000000000000"
}

// write logs and maybe publishes the access line of a finished request.
// The line is made only when it goes somewhere: the local log at Info,
// or the sampler's share published.
func (q *accessRequest) write(c *serviceCounters, r *http.Request, status int, in, out int64, took time.Duration) {
	l := q.log
	ce := l.logger.Check(zapcore.InfoLevel, "handled request")
	var share float64
	var st *store.Store
	if l.rate > 0 {
		if sh, ok := c.accessSample.admit(time.Now(), l.rate); ok {
			share, st = sh, l.conn()
		}
	}
	if ce == nil && st == nil {
		return
	}
	line := store.AccessLine{Gateway: l.gateway, Namespace: c.namespace, Service: c.service, Instance: proxiedInstance(r, q.svc),
		Route: q.route, Method: r.Method, Host: r.Host, Path: q.path, Status: status, BytesIn: in, BytesOut: out,
		Duration: took.Seconds(), RequestID: q.id}
	line.ClientIP, _ = caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if p := q.policy; p != nil {
		if p.Query {
			line.Query = q.query
		}
		for _, h := range p.Headers {
			if v := r.Header.Get(h); v != "" {
				if line.Headers == nil {
					line.Headers = make(map[string]string, len(p.Headers))
				}
				line.Headers[http.CanonicalHeaderKey(h)] = v
			}
		}
	}
	if ce != nil {
		writeLine(ce, &line)
	}
	if st != nil {
		publishLine(st, line, share)
	}
}

// fieldsPool holds the fields of a line being written: zap's Write keeps
// no reference to them, and a fresh slice would be the largest
// allocation of a request's line.
var fieldsPool = sync.Pool{New: func() any { return new([17]zap.Field) }}

// writeLine writes line through ce.
func writeLine(ce *zapcore.CheckedEntry, line *store.AccessLine) {
	buf := fieldsPool.Get().(*[17]zap.Field)
	fs := append(buf[:0], zap.String("gateway", line.Gateway), zap.String("ns", line.Namespace), zap.String("svc", line.Service),
		zap.String("instance", line.Instance), zap.Int("route", line.Route), zap.String("method", line.Method),
		zap.String("host", line.Host), zap.String("path", line.Path))
	if line.Query != "" {
		fs = append(fs, zap.String("query", line.Query))
	}
	fs = append(fs, zap.Int("status", line.Status), zap.Int64("bytes_in", line.BytesIn), zap.Int64("bytes_out", line.BytesOut),
		zap.Float64("duration_s", line.Duration), zap.String("client_ip", line.ClientIP), zap.String("request_id", line.RequestID))
	if line.Headers != nil {
		fs = append(fs, zap.Any("headers", line.Headers))
	}
	ce.Write(fs...)
	clear(buf[:])
	fieldsPool.Put(buf)
}

// publishLine publishes line (a copy: only a published line is
// allocated) with its time and share.
func publishLine(st *store.Store, line store.AccessLine, share float64) {
	line.At, line.Sample = time.Now().UTC(), share
	b, err := json.Marshal(&line)
	if err != nil {
		return
	}
	// Core NATS, buffered: never waits for the store, and a line lost
	// while it is away is a line lost.
	_ = st.NC.Publish(st.Names.AccessSubject(line.Namespace, line.Service, line.Gateway), b)
}

// proxiedInstance is the ID of svc's instance the proxy last sent r to,
// "" when it sent it to none.
func proxiedInstance(r *http.Request, svc *projection.Service) string {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok || svc == nil {
		return ""
	}
	addr, ok := repl.GetString("http.reverse_proxy.upstream.hostport")
	if !ok || addr == "" {
		return ""
	}
	return instanceOf(svc, addr)
}

// accessSampler bounds the lines a service's requests publish: at most
// rate a second. Past the rate, lines are drawn at random with the share
// the previous second allowed (rate / its requests), so that a second's
// lines spread over it rather than being its first; Sample is that share.
// Counts are approximate where seconds turn over under contention.
type accessSampler struct {
	sec              atomic.Int64
	seen, sent, prev atomic.Int64
}

// admit reports whether a request at now publishes its line, and the
// share of the second's requests published.
func (s *accessSampler) admit(now time.Time, rate int64) (float64, bool) {
	sec := now.Unix()
	if old := s.sec.Load(); old != sec && s.sec.CompareAndSwap(old, sec) {
		seen := s.seen.Swap(0)
		if old != sec-1 {
			seen = 0 // a quiet second between
		}
		s.prev.Store(seen)
		s.sent.Store(0)
	}
	s.seen.Add(1)
	share := 1.0
	if prev := s.prev.Load(); prev > rate {
		share = float64(rate) / float64(prev)
		if rand.Float64() >= share {
			return share, false
		}
	}
	if s.sent.Add(1) > rate {
		return share, false
	}
	return share, true
}
