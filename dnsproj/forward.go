package dnsproj

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ForwardConfig configures the forwarder for names outside the zone.
type ForwardConfig struct {
	// Upstreams are resolvers as "host" or "host:port" (port 53). None
	// turns forwarding off: names outside the zone get REFUSED.
	Upstreams []string
	// Policy orders the upstreams tried: "sequential" (default; the first
	// healthy one, in the order given) or "random".
	Policy string
	// Timeout bounds one attempt at one upstream; default 2s.
	Timeout time.Duration
	// HealthCheck is how often every upstream is probed with ". IN NS";
	// default 2s. A failed query triggers a probe at once.
	HealthCheck time.Duration
	// MaxFails is how many failed queries in a row mark an upstream down
	// until a probe succeeds; default 2.
	MaxFails int
}

// Forward policies.
const (
	PolicySequential = "sequential"
	PolicyRandom     = "random"
)

// forwarder is the "forward" link: it sends the query to the first healthy
// upstream and fails over to the next on error. Upstreams marked down are
// tried only when every upstream is down.
type forwarder struct {
	ups      []*upstream
	random   bool
	timeout  time.Duration
	interval time.Duration
	maxFails int32
	log      *zap.Logger
	m        *metrics
	kick     chan struct{}
}

type upstream struct {
	addr  string
	fails atomic.Int32
	down  atomic.Bool
	udp   *dns.Client
	tcp   *dns.Client
}

var errNoUpstream = errors.New("no upstream answered")

func (cfg ForwardConfig) validate() error {
	switch cfg.Policy {
	case "", PolicySequential, PolicyRandom:
	default:
		return fmt.Errorf("forward policy %q: must be %q or %q", cfg.Policy, PolicySequential, PolicyRandom)
	}
	if cfg.Timeout < 0 || cfg.HealthCheck < 0 || cfg.MaxFails < 0 {
		return errors.New("forward: timeout, health check and max fails must not be negative")
	}
	seen := make(map[string]bool)
	for _, u := range cfg.Upstreams {
		addr, err := UpstreamAddr(u)
		if err != nil {
			return err
		}
		if seen[addr] {
			return fmt.Errorf("forward upstream %s: listed twice", addr)
		}
		seen[addr] = true
	}
	return nil
}

func newForwarder(cfg ForwardConfig, log *zap.Logger, m *metrics) (*forwarder, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f := &forwarder{
		timeout: cfg.Timeout, interval: cfg.HealthCheck, maxFails: int32(cfg.MaxFails),
		log: log, m: m, kick: make(chan struct{}, 1),
	}
	f.random = cfg.Policy == PolicyRandom
	if f.timeout == 0 {
		f.timeout = 2 * time.Second
	}
	if f.interval == 0 {
		f.interval = 2 * time.Second
	}
	if f.maxFails == 0 {
		f.maxFails = 2
	}
	for _, u := range cfg.Upstreams {
		addr, _ := UpstreamAddr(u)
		f.ups = append(f.ups, &upstream{
			addr: addr,
			udp:  &dns.Client{Net: "udp", Timeout: f.timeout, UDPSize: dns.MaxMsgSize},
			tcp:  &dns.Client{Net: "tcp", Timeout: f.timeout},
		})
		m.upstreamUp.WithLabelValues(addr).Set(1)
	}
	return f, nil
}

// UpstreamAddr normalises an upstream resolver address to host:port,
// adding port 53.
func UpstreamAddr(s string) (string, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "dns://")
	if s == "" {
		return "", errors.New("forward upstream: empty address")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = strings.Trim(s, "[]"), "53"
	}
	if _, err := net.LookupPort("udp", port); err != nil || port == "0" {
		return "", fmt.Errorf("forward upstream %q: bad port %q", s, port)
	}
	if net.ParseIP(host) == nil {
		return "", fmt.Errorf("forward upstream %q: must be an IP address (a resolver cannot depend on resolving)", s)
	}
	return net.JoinHostPort(host, port), nil
}

func (f *forwarder) Name() string { return "forward" }

// order returns the upstreams to try: healthy ones by policy, then the
// down ones as a last resort.
func (f *forwarder) order() []*upstream {
	out := make([]*upstream, 0, len(f.ups))
	for _, u := range f.ups {
		if !u.down.Load() {
			out = append(out, u)
		}
	}
	healthy := len(out)
	for _, u := range f.ups {
		if u.down.Load() {
			out = append(out, u)
		}
	}
	if f.random && healthy > 1 {
		rand.Shuffle(healthy, func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
	return out
}

func (f *forwarder) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	_, tcp := w.LocalAddr().(*net.TCPAddr)
	var errs []error
	for _, u := range f.order() {
		f.m.forwards.WithLabelValues(u.addr).Inc()
		resp, err := f.exchange(ctx, u, r, tcp)
		if err != nil {
			f.m.forwardErrors.WithLabelValues(u.addr).Inc()
			errs = append(errs, fmt.Errorf("%s: %w", u.addr, err))
			if u.fails.Add(1) >= f.maxFails && !u.down.Swap(true) {
				f.m.upstreamUp.WithLabelValues(u.addr).Set(0)
				f.log.Warn("dns upstream marked down", zap.String("upstream", u.addr), zap.Error(err))
			}
			select {
			case f.kick <- struct{}{}:
			default:
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		u.fails.Store(0)
		resp.Id = r.Id
		return resp.Rcode, w.WriteMsg(resp)
	}
	return dns.RcodeServerFailure, errors.Join(errNoUpstream, errors.Join(errs...))
}

// exchange asks u over UDP, retrying over TCP when the reply is truncated;
// a query that came over TCP goes over TCP.
func (f *forwarder) exchange(ctx context.Context, u *upstream, r *dns.Msg, tcp bool) (*dns.Msg, error) {
	q := *r // shallow: only the id changes, so the client's id is never sent on
	q.Id = dns.Id()
	client := u.udp
	if tcp {
		client = u.tcp
	}
	resp, _, err := client.ExchangeContext(ctx, &q, u.addr)
	if err == nil && resp.Truncated && !tcp {
		resp, _, err = u.tcp.ExchangeContext(ctx, &q, u.addr)
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, r.Question[0].Name) ||
		resp.Question[0].Qtype != r.Question[0].Qtype {
		return nil, errors.New("reply does not match the question")
	}
	return resp, nil
}

// healthLoop probes every upstream each interval, and at once after a
// failed query, until ctx ends.
func (f *forwarder) healthLoop(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
		for _, u := range f.ups {
			f.probe(ctx, u)
		}
	}
}

func (f *forwarder) probe(ctx context.Context, u *upstream) {
	q := new(dns.Msg)
	q.SetQuestion(".", dns.TypeNS)
	_, _, err := u.udp.ExchangeContext(ctx, q, u.addr)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !u.down.Swap(true) {
			f.m.upstreamUp.WithLabelValues(u.addr).Set(0)
			f.log.Warn("dns upstream failed its health check", zap.String("upstream", u.addr), zap.Error(err))
		}
		return
	}
	u.fails.Store(0)
	if u.down.Swap(false) {
		f.m.upstreamUp.WithLabelValues(u.addr).Set(1)
		f.log.Info("dns upstream healthy again", zap.String("upstream", u.addr))
	} else if c := f.log.Check(zapcore.DebugLevel, "dns upstream healthy"); c != nil {
		c.Write(zap.String("upstream", u.addr))
	}
}
