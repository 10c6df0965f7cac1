package caddymodule

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/store"
)

// A route's allow and deny lists (store.Route.Allow, Deny) judge the
// client's address as Caddy determined it (the client_ip variable): the
// peer's own, or, from a peer in the server's trusted_proxies, the one
// its client_ip_headers (X-Forwarded-For by default) name. So an
// X-Forwarded-For from anyone else changes nothing. Deny wins over allow;
// with an allow list, an address outside it is refused; a request whose
// client address Caddy could not determine is refused (fail closed).
// Either way the answer is a 403 before anything else of the route runs.

// addIPFilter puts rt's allow/deny filter first in p's handlers, when rt
// has lists: a refused client meets no redirect, auth challenge or
// instance.
func (p *routePolicy) addIPFilter(rt *store.Route, h *Handler) error {
	if len(rt.Allow) == 0 && len(rt.Deny) == 0 {
		return nil
	}
	f := &ipFilter{logger: h.logger}
	var err error
	if len(rt.Allow) > 0 {
		if f.allow, err = newIPSet(rt.Allow); err != nil {
			return fmt.Errorf("allow: %w", err)
		}
	}
	if f.deny, err = newIPSet(rt.Deny); err != nil {
		return fmt.Errorf("deny: %w", err)
	}
	p.pre = append(p.pre, f)
	return nil
}

// ipFilter answers 403 to a client inside deny or, when allow is set,
// outside allow.
type ipFilter struct {
	allow, deny *ipSet // allow nil: every address not denied
	logger      *zap.Logger
}

func (f *ipFilter) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if a, err := netip.ParseAddr(ip); err == nil && f.admits(a) {
		return next.ServeHTTP(w, r)
	}
	if c := f.logger.Check(zapcore.DebugLevel, "client refused by the route's allow/deny lists"); c != nil {
		c.Write(zap.String("client_ip", ip), zap.String("host", r.Host), zap.String("path", r.URL.Path))
	}
	return plainError(w, http.StatusForbidden, "forbidden\n")
}

// admits reports whether a passes the lists.
func (f *ipFilter) admits(a netip.Addr) bool {
	a = a.Unmap()
	if f.deny.contains(a) {
		return false
	}
	return f.allow == nil || f.allow.contains(a)
}

// ipSet is a set of addresses as sorted, disjoint, non-adjacent ranges
// per family: a lookup is a binary search, about 14 comparisons for
// 10,000 CIDRs, with no allocation.
type ipSet struct {
	v4 []ipRange[ip4]
	v6 []ipRange[u128]
}

type ipRange[T ipKey[T]] struct{ lo, hi T }

// ipKey is an address as a number, IPv4 (ip4) or IPv6 (u128).
type ipKey[T any] interface {
	cmp(T) int
	next() T
}

// newIPSet builds the set of entries (IP addresses and CIDRs, as the
// manifest normalised them; a gateway still refuses what does not
// parse rather than guess).
func newIPSet(entries []string) (*ipSet, error) {
	s := &ipSet{}
	for _, e := range entries {
		var pf netip.Prefix
		var err error
		if strings.Contains(e, "/") {
			pf, err = netip.ParsePrefix(e)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(e); err == nil && a.Zone() == "" {
				a = a.Unmap()
				pf = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil || !pf.IsValid() {
			return nil, fmt.Errorf("%q is not an IP address or a CIDR", e)
		}
		pf = pf.Masked()
		lo, hi := pf.Addr(), lastAddr(pf)
		if lo.Is4() {
			s.v4 = append(s.v4, ipRange[ip4]{v4(lo), v4(hi)})
		} else {
			s.v6 = append(s.v6, ipRange[u128]{v6(lo), v6(hi)})
		}
	}
	s.v4 = mergeRanges(s.v4, ip4(^uint32(0)))
	s.v6 = mergeRanges(s.v6, u128{^uint64(0), ^uint64(0)})
	return s, nil
}

func (s *ipSet) contains(a netip.Addr) bool {
	if s == nil {
		return false
	}
	if a.Is4() {
		return inRanges(s.v4, v4(a))
	}
	return inRanges(s.v6, v6(a))
}

// inRanges reports whether x is in one of rs (sorted, disjoint).
func inRanges[T ipKey[T]](rs []ipRange[T], x T) bool {
	i, _ := slices.BinarySearchFunc(rs, x, func(r ipRange[T], x T) int {
		if r.hi.cmp(x) < 0 {
			return -1
		}
		return 0 // the first range ending at or past x
	})
	return i < len(rs) && rs[i].lo.cmp(x) <= 0
}

// mergeRanges sorts rs and joins those that overlap or touch, so the
// ranges are disjoint and a binary search finds the one that may hold
// an address.
func mergeRanges[T ipKey[T]](rs []ipRange[T], max T) []ipRange[T] {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b ipRange[T]) int { return a.lo.cmp(b.lo) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if last.hi.cmp(max) == 0 || r.lo.cmp(last.hi.next()) <= 0 {
			if r.hi.cmp(last.hi) > 0 {
				last.hi = r.hi
			}
			continue
		}
		out = append(out, r)
	}
	return slices.Clip(out)
}

// lastAddr is the highest address of pf (masked).
func lastAddr(pf netip.Prefix) netip.Addr {
	b := pf.Addr().AsSlice()
	for i := pf.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

type u128 struct{ hi, lo uint64 }

func (x u128) cmp(y u128) int {
	switch {
	case x.hi < y.hi || x.hi == y.hi && x.lo < y.lo:
		return -1
	case x == y:
		return 0
	}
	return 1
}

func (x u128) next() u128 {
	if x.lo == ^uint64(0) {
		return u128{x.hi + 1, 0}
	}
	return u128{x.hi, x.lo + 1}
}

type ip4 uint32

func (x ip4) cmp(y ip4) int { return cmp.Compare(x, y) }
func (x ip4) next() ip4     { return x + 1 }

func v4(a netip.Addr) ip4 { b := a.As4(); return ip4(binary.BigEndian.Uint32(b[:])) }

func v6(a netip.Addr) u128 {
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}
