package caddymodule

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// The sticky canary's bucket cookie is signed (store.SignCanaryBucket)
// with the fleet's key, which the control plane makes and gateways only
// read: a cookie a gateway of this fleet did not sign for this canary
// (forged, tampered with, from another canary) is no cookie, and its
// client is bucketed as a new one. Without the key (not read yet) no
// cookie is trusted or set: every client is split as a new one.

// canaryKeyRefresh is how often a gateway reads the key again once it has
// one, so that a key the control plane replaces is used within it.
const canaryKeyRefresh = time.Minute

// canaryKey returns the fleet's canary cookie key, or nil before it was
// read.
func (s *sharedProjection) canaryKey() []byte {
	if k := s.cookieKey.Load(); k != nil {
		return *k
	}
	return nil
}

// lastConn is the store the projection opened last (the one it uses).
func (s *sharedProjection) lastConn() *store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) == 0 {
		return nil
	}
	return s.conns[len(s.conns)-1]
}

// readCanaryKey reads the fleet's canary cookie key from st, keeping it
// when there is one.
func (s *sharedProjection) readCanaryKey(ctx context.Context, st *store.Store) error {
	k, err := st.CanaryCookieKeyOf(ctx)
	if err == nil && k != nil {
		s.cookieKey.Store(&k.Key)
	}
	return err
}

// canaryKeyLoop reads the fleet's canary cookie key every second until it
// has it (the projection's connect reads it first), then every
// canaryKeyRefresh, until ctx ends.
func (s *sharedProjection) canaryKeyLoop(ctx context.Context) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if st := s.lastConn(); st != nil {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := s.readCanaryKey(c, st)
			cancel()
			if s.cookieKey.Load() == nil && ctx.Err() == nil && !warned {
				s.logger.Warn("no canary cookie key yet: sticky canaries split every client as a new one", zap.Error(err))
				warned = true
			}
		}
		next := time.Second
		if s.cookieKey.Load() != nil {
			next = canaryKeyRefresh
		}
		t.Reset(next)
	}
}

// canaryClientRate is how many of one client's requests per second a
// sticky canary counts when the client's cookie chose the side: the rest
// are served, and counted in the service's traffic, but not in the
// figures the canary is judged on.
const canaryClientRate = 100

// maxCanaryClients bounds the clients one canary tracks per second; a
// client past it has no cookie-routed request counted that second.
const maxCanaryClients = 100_000

// clientWindow counts each client's cookie-routed requests of one canary
// in the current second.
type clientWindow struct {
	mu   sync.Mutex
	sec  int64
	seen map[netip.Addr]uint32
}

// admit reports whether a cookie-routed request of client counts in the
// canary's figures, counting it.
func (w *clientWindow) admit(client netip.Addr, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sec := now.Unix(); sec != w.sec || w.seen == nil {
		w.sec = sec
		if w.seen == nil {
			w.seen = make(map[netip.Addr]uint32)
		}
		clear(w.seen)
	}
	n, ok := w.seen[client]
	if n >= canaryClientRate || (!ok && len(w.seen) >= maxCanaryClients) {
		return false
	}
	w.seen[client] = n + 1
	return true
}

// clientOf is the client r counts as: its address as Caddy determined it
// (the peer, or what trusted proxies say), an IPv6 one by its /64, which
// one subscriber usually holds whole.
func clientOf(r *http.Request) netip.Addr {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if ip == "" {
		ip, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}
