package caddymodule

import (
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
// per family, each address a 128-bit number (IPv4 in the low 32 bits of
// its own table): a lookup is a binary search, about 14 comparisons for
// 10,000 CIDRs, with no allocation.
type ipSet struct {
	v4, v6 []ipRange
}

type ipRange struct{ lo, hi u128 }

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
		r := ipRange{addrKey(pf.Addr()), addrKey(lastAddr(pf))}
		if pf.Addr().Is4() {
			s.v4 = append(s.v4, r)
		} else {
			s.v6 = append(s.v6, r)
		}
	}
	s.v4, s.v6 = mergeRanges(s.v4), mergeRanges(s.v6)
	return s, nil
}

func (s *ipSet) contains(a netip.Addr) bool {
	if s == nil {
		return false
	}
	rs := s.v6
	if a.Is4() {
		rs = s.v4
	}
	x := addrKey(a)
	// The first range ending at or past x is the only one that may hold
	// it.
	i, j := 0, len(rs)
	for i < j {
		m := int(uint(i+j) >> 1)
		if rs[m].hi.less(x) {
			i = m + 1
		} else {
			j = m
		}
	}
	return i < len(rs) && !x.less(rs[i].lo)
}

// mergeRanges sorts rs and joins those that overlap or touch, so the
// ranges are disjoint and a binary search finds the one that may hold
// an address.
func mergeRanges(rs []ipRange) []ipRange {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b ipRange) int { return a.lo.cmp(b.lo) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if last.hi == maxU128 || !last.hi.next().less(r.lo) {
			if last.hi.less(r.hi) {
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

// u128 is an address as a number.
type u128 struct{ hi, lo uint64 }

var maxU128 = u128{^uint64(0), ^uint64(0)}

func addrKey(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{0, uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || x.hi == y.hi && x.lo < y.lo }

func (x u128) cmp(y u128) int {
	switch {
	case x.less(y):
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
