package caddymodule

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Fleet-wide rate limits (store.RateLimit). Every gateway counts a
// route's requests per key in fixed windows aligned to wall-clock time
// (the window's index is the Unix time divided by its length), so every
// gateway counts the same window. Each counts locally, under a shard's
// lock, and shares its counts every ~250 ms (ratelimit_share.go); a
// request is allowed while this gateway's count plus the latest counts
// the others published for the window stay under the limit. Nothing is
// written to the store.
//
// Cut from the store (its connection down, or not even its own counts
// heard back for rateSilence) a gateway limits a key to the limit times
// its share of the fleet's count in the last window it knew, or the
// limit over the number of gateways it last knew; the others reserve a
// silent gateway what it counted in its last full window, so that the
// fleet stays about within the limit. A gateway that comes back counts
// with the others again at once.

// rateSilence is how long the store, or another gateway, may stay
// silent before it is taken as cut off: four rounds of sharing, each of
// which carries at least a heartbeat. Counted in rounds rather than
// windows: a gateway cut for two windows of a minute would overshoot
// the others' budget for two minutes. A false alarm only limits harder
// for a moment.
const rateSilence = 4 * rateShareInterval

// rateShards spreads a route's keys over locks, so that requests of
// different clients rarely wait on one another.
const rateShards = 32

// rateTable holds every rate-limited route of this gateway and what it
// hears of the other gateways. It lives with the shared projection, so a
// config reload keeps the counts.
type rateTable struct {
	gateway string
	now     func() time.Time

	mu     sync.Mutex
	routes map[string]*rateLimiter
	peers  map[string]*ratePeer

	// heard is when a counts message was last received (Unix ns), this
	// gateway's own echo included: the store is reachable.
	heard atomic.Int64
	// conn is the connection the counts are shared on; nil before one.
	conn atomic.Pointer[store.Store]
	// down is set while conn is not connected, as the sharing loop last
	// saw it: a request reads one atomic, not the connection's lock.
	down atomic.Bool
	// known is how many gateways (this one included) were heard while
	// the store was reachable, for the share of a key never seen.
	known atomic.Int64
}

func newRateTable(gateway string) *rateTable {
	t := &rateTable{gateway: gateway, now: time.Now, routes: map[string]*rateLimiter{}, peers: map[string]*ratePeer{}}
	t.known.Store(1)
	t.down.Store(true)
	return t
}

// ratePeer is another gateway, and when it was last heard (Unix ns).
type ratePeer struct {
	name  string
	heard atomic.Int64
}

// rateKeyKind is what a limit counts apart.
type rateKeyKind uint8

const (
	rateByIP rateKeyKind = iota
	rateByRoute
	rateByHeader
)

// rateLimiter is one route's limit and its counts.
type rateLimiter struct {
	id     string
	t      *rateTable
	limit  atomic.Int64
	window time.Duration
	kind   rateKeyKind
	header string
	// cutoff is how long the store may stay silent before this gateway
	// limits with its share (rateSilence); forget how long a silent
	// gateway's usual count stays reserved.
	cutoff, forget time.Duration
	shards         [rateShards]rateShard
}

type rateShard struct {
	mu   sync.Mutex
	keys map[uint64]*rateKeyState
	_    [40]byte // a cache line each
}

// rateKeyState is one key's counts: this gateway's in the current and
// the previous window, the others' latest.
type rateKeyState struct {
	win, n         int64
	prevWin, prevN int64
	// dirty: n changed since it was last published.
	dirty bool
	// share is this gateway's share of the fleet's count in the last
	// window known while the store was reachable; 0 when unknown.
	share float64
	peers []peerCount
}

// peerCount is another gateway's latest count of a key, and its count in
// the window before.
type peerCount struct {
	peer           *ratePeer
	win, n         int64
	prevWin, prevN int64
}

// limiter returns the table's limiter of route index idx of svc for rl,
// made on first use; a limit changed by a deploy keeps the counts.
func (t *rateTable) limiter(svc *projection.Service, idx int, rl *store.RateLimit) (*rateLimiter, error) {
	window := time.Duration(rl.Window)
	if rl.Requests < 1 || window < time.Second {
		return nil, fmt.Errorf("rate_limit: %d requests per %s cannot be enforced", rl.Requests, window)
	}
	kind, header := rateByIP, ""
	switch k := rl.Key; {
	case k == "" || k == store.RateKeyIP:
	case k == store.RateKeyRoute:
		kind = rateByRoute
	case strings.HasPrefix(k, store.RateKeyHeader) && len(k) > len(store.RateKeyHeader):
		kind, header = rateByHeader, http.CanonicalHeaderKey(strings.TrimPrefix(k, store.RateKeyHeader))
	default:
		return nil, fmt.Errorf("rate_limit: unknown key %q", k)
	}
	id := fmt.Sprintf("%s/%s/%d/%s/%s", svc.Namespace, svc.Name, idx, window, rl.Key)
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.routes[id]
	if l == nil {
		l = &rateLimiter{id: id, t: t, window: window, kind: kind, header: header,
			cutoff: rateSilence, forget: min(max(3*window, 30*time.Second), 5*time.Minute)}
		for i := range l.shards {
			l.shards[i].keys = map[uint64]*rateKeyState{}
		}
		t.routes[id] = l
	}
	l.limit.Store(int64(rl.Requests))
	return l, nil
}

// cut reports whether the store has been out of reach for longer than
// cutoff at now.
func (t *rateTable) cut(now int64, cutoff time.Duration) bool {
	return t.down.Load() || now-t.heard.Load() > int64(cutoff)
}

// keyOf hashes what r is counted under.
func (l *rateLimiter) keyOf(r *http.Request) uint64 {
	switch l.kind {
	case rateByRoute:
		return 0
	case rateByHeader:
		return hashKey(r.Header.Get(l.header))
	}
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return hashKey(ip)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return hashKey(host)
}

// hashKey is FNV-1a (64 bits): the same at every gateway, and no
// allocation.
func hashKey(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// allow counts a request of key at now if the fleet is under the limit,
// and otherwise says how long until the window ends.
func (l *rateLimiter) allow(key uint64, now time.Time) (bool, time.Duration) {
	ns := now.UnixNano()
	w := ns / int64(l.window)
	limit := l.limit.Load()
	cut := l.t.cut(ns, l.cutoff)
	sh := &l.shards[key%rateShards]
	sh.mu.Lock()
	ks := sh.keys[key]
	if ks == nil {
		ks = &rateKeyState{win: w}
		sh.keys[key] = ks
	}
	ks.roll(w)
	var ok bool
	if cut {
		share := ks.share
		if share <= 0 {
			share = 1 / float64(max(l.t.known.Load(), 1))
		}
		ok = float64(ks.n) < math.Ceil(float64(limit)*share)
	} else {
		ok = ks.n+ks.others(w, ns, l.cutoff, l.forget) < limit
	}
	if ok {
		ks.n++
		ks.dirty = true
	}
	sh.mu.Unlock()
	if ok {
		return true, 0
	}
	return false, time.Duration((w+1)*int64(l.window) - ns)
}

// roll moves the key's own count to window w.
func (ks *rateKeyState) roll(w int64) {
	if ks.win == w {
		return
	}
	if ks.win == w-1 {
		ks.prevWin, ks.prevN = ks.win, ks.n
	} else if ks.prevWin != w-1 {
		ks.prevWin, ks.prevN = w-1, 0
	}
	if ks.win < w {
		ks.win, ks.n, ks.dirty = w, 0, false
	}
}

// ownIn is this gateway's count of the key in window w (w or the one
// before the current), 0 when unknown.
func (ks *rateKeyState) ownIn(w int64) int64 {
	switch w {
	case ks.win:
		return ks.n
	case ks.prevWin:
		return ks.prevN
	}
	return 0
}

// in is the peer's count in window w, 0 when unknown.
func (pc *peerCount) in(w int64) int64 {
	switch w {
	case pc.win:
		return pc.n
	case pc.prevWin:
		return pc.prevN
	}
	return 0
}

// others is what the other gateways count of the key in window w: the
// latest count of each heard within cutoff; for one silent longer (but
// not forgotten), what it counted in the last full window it told (or
// so far in this one, if more), as it likely still does.
func (ks *rateKeyState) others(w, now int64, cutoff, forget time.Duration) int64 {
	var sum int64
	for i := range ks.peers {
		pc := &ks.peers[i]
		switch age := now - pc.peer.heard.Load(); {
		case age <= int64(cutoff):
			if pc.win == w {
				sum += pc.n
			}
		case age <= int64(forget):
			// Its latest window, if past, is its last full one.
			usual := pc.n
			if pc.win == w {
				usual = max(pc.n, pc.in(w-1))
			}
			sum += usual
		}
	}
	return sum
}

// rateLimitHandler answers 429 past the route's limit.
type rateLimitHandler struct{ l *rateLimiter }

func (h rateLimitHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ok, wait := h.l.allow(h.l.keyOf(r), h.l.t.now())
	if ok {
		return next.ServeHTTP(w, r)
	}
	w.Header().Set("Retry-After", strconv.FormatInt(max(int64(math.Ceil(wait.Seconds())), 1), 10))
	return plainError(w, http.StatusTooManyRequests, "rate limit exceeded\n")
}

// provisionRateLimit puts rt's rate limit, if any, into p: first after
// the HTTPS redirect (a redirect costs the instance nothing), before any
// authentication it protects from guessing.
func (h *Handler) provisionRateLimit(p *routePolicy, svc *projection.Service, idx int, rt *store.Route) error {
	if rt.RateLimit == nil {
		return nil
	}
	l, err := h.app.shared.rates.limiter(svc, idx, rt.RateLimit)
	if err != nil {
		return err
	}
	// After the address filter and the HTTPS redirect, before
	// authentication: a client over its limit costs no password check.
	at := 0
	for i, m := range p.pre {
		switch m.(type) {
		case *ipFilter, redirectHTTPS:
			at = i + 1
		}
	}
	p.pre = append(p.pre[:at:at], append([]caddyhttp.MiddlewareHandler{rateLimitHandler{l}}, p.pre[at:]...)...)
	return nil
}
