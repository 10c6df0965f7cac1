package dnsproj

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// CacheConfig configures the cache of forwarded answers.
type CacheConfig struct {
	// Disabled turns the cache off.
	Disabled bool
	// Size is the most answers held; default 10000. When full, a random
	// entry makes room.
	Size int
	// MaxTTL caps how long a positive answer is kept; default 1h.
	MaxTTL time.Duration
	// MaxNegativeTTL caps how long NXDOMAIN and NODATA are kept; default 30m.
	MaxNegativeTTL time.Duration
}

// cache is the "cache" link. It sits after the zone, so it only ever sees
// (and holds) answers for names outside the zone: zone answers always come
// fresh from the current view.
type cache struct {
	next   Handler
	size   int
	maxTTL time.Duration
	maxNeg time.Duration
	m      *metrics
	now    func() time.Time

	mu    sync.Mutex
	items map[cacheKey]*cacheItem
}

type cacheKey struct {
	name         string // lower case
	qtype, class uint16
	do, cd       bool
}

type cacheItem struct {
	rcode             int
	authenticatedData bool
	answer, ns, extra []dns.RR
	stored, expires   time.Time
}

func (cfg CacheConfig) validate() error {
	if cfg.Size < 0 || cfg.MaxTTL < 0 || cfg.MaxNegativeTTL < 0 {
		return fmt.Errorf("cache: size and ttls must not be negative")
	}
	return nil
}

func newCache(cfg CacheConfig, m *metrics) (*cache, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Size == 0 {
		cfg.Size = 10000
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.MaxNegativeTTL == 0 {
		cfg.MaxNegativeTTL = 30 * time.Minute
	}
	return &cache{
		size: cfg.Size, maxTTL: cfg.MaxTTL, maxNeg: cfg.MaxNegativeTTL, m: m,
		now: time.Now, items: make(map[cacheKey]*cacheItem),
	}, nil
}

func (c *cache) plugin(next Handler) Handler {
	c.next = next
	return c
}

func (c *cache) Name() string { return "cache" }

func (c *cache) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	q := r.Question[0]
	key := cacheKey{name: lowerASCII(q.Name), qtype: q.Qtype, class: q.Qclass, cd: r.CheckingDisabled}
	if opt := r.IsEdns0(); opt != nil {
		key.do = opt.Do()
	}
	now := c.now()
	c.mu.Lock()
	it := c.items[key]
	if it != nil && !now.Before(it.expires) {
		delete(c.items, key)
		c.m.cacheEntries.Set(float64(len(c.items)))
		it = nil
	}
	c.mu.Unlock()
	if it != nil {
		c.m.cacheHits.Inc()
		m := new(dns.Msg)
		m.SetReply(r)
		m.Rcode = it.rcode
		m.RecursionAvailable = true
		m.AuthenticatedData = it.authenticatedData
		age := uint32(now.Sub(it.stored) / time.Second)
		m.Answer, m.Ns, m.Extra = aged(it.answer, age), aged(it.ns, age), aged(it.extra, age)
		return it.rcode, w.WriteMsg(m)
	}
	c.m.cacheMisses.Inc()
	return c.next.ServeDNS(ctx, &cacheWriter{ResponseWriter: w, c: c, key: key}, r)
}

// aged copies rrs with their TTLs lowered by age seconds.
func aged(rrs []dns.RR, age uint32) []dns.RR {
	if len(rrs) == 0 {
		return nil
	}
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		cp := dns.Copy(rr)
		h := cp.Header()
		if h.Ttl > age {
			h.Ttl -= age
		} else {
			h.Ttl = 0
		}
		out[i] = cp
	}
	return out
}

// cacheWriter stores the reply on its way to the client.
type cacheWriter struct {
	dns.ResponseWriter
	c   *cache
	key cacheKey
}

func (cw *cacheWriter) WriteMsg(m *dns.Msg) error {
	cw.c.store(cw.key, m)
	return cw.ResponseWriter.WriteMsg(m)
}

// store keeps a copy of m for its TTL: the smallest TTL of its records for
// a positive answer, the SOA's negative TTL for NXDOMAIN/NODATA, each
// capped. Truncated replies, errors and answers without a TTL are not kept.
func (c *cache) store(key cacheKey, m *dns.Msg) {
	if m.Truncated || (m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError) {
		return
	}
	extra := make([]dns.RR, 0, len(m.Extra))
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	var ttl time.Duration
	negative := m.Rcode == dns.RcodeNameError || len(m.Answer) == 0
	if negative {
		soa := findSOA(m.Ns)
		if soa == nil {
			return // no SOA: RFC 2308 says do not cache
		}
		ttl = time.Duration(min(soa.Hdr.Ttl, soa.Minttl)) * time.Second
		ttl = min(ttl, c.maxNeg)
	} else {
		low := ^uint32(0)
		for _, set := range [][]dns.RR{m.Answer, m.Ns, extra} {
			for _, rr := range set {
				low = min(low, rr.Header().Ttl)
			}
		}
		ttl = min(time.Duration(low)*time.Second, c.maxTTL)
	}
	if ttl <= 0 || c.size <= 0 {
		return
	}
	now := c.now()
	// Copies: the server truncates the message it is handed.
	it := &cacheItem{
		rcode: m.Rcode, authenticatedData: m.AuthenticatedData,
		answer: slices.Clone(m.Answer), ns: slices.Clone(m.Ns), extra: extra,
		stored: now, expires: now.Add(ttl),
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; !ok && len(c.items) >= c.size {
		for k := range c.items { // map order is random: a random eviction
			delete(c.items, k)
			break
		}
	}
	c.items[key] = it
	c.m.cacheEntries.Set(float64(len(c.items)))
}

func findSOA(rrs []dns.RR) *dns.SOA {
	for _, rr := range rrs {
		if soa, ok := rr.(*dns.SOA); ok {
			return soa
		}
	}
	return nil
}
