package dnsproj

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults of Config.
const (
	DefaultZone         = "edgeplane.internal."
	DefaultTTL          = 5 * time.Second
	DefaultMaxUDPSize   = 1232 // the DNS flag day 2020 size: no IP fragmentation
	DefaultMaxQuerySize = 1232
	DefaultListen       = "127.0.0.1:1053"
)

// Config configures a Server. The zero value serves DefaultZone with no
// forwarder: names outside the zone get REFUSED.
type Config struct {
	// Zone is the cluster zone answered from the projection; default
	// DefaultZone. Case and a missing trailing dot do not matter.
	Zone string
	// TTL of every record in the zone, and the negative-caching TTL in its
	// SOA; default 5s. Short, so a projection change reaches clients fast.
	TTL time.Duration
	// Region is the server's region: a service's name is answered with
	// its instances in this region first (see projection.View.Tiers for
	// the order of the others, and the service's locality policy). Empty
	// serves every active region alike, draining ones only when no
	// active one can.
	Region string
	// RegionFor, when set and Region is not, is the server's region under
	// each view, asked once per view: a server beside a gateway answers
	// as the gateway routes, and the gateway's region may follow its
	// machine's record in the view.
	RegionFor func(v View) string
	// Nearest, when set, is the order in which the server's region
	// falls back to the others, nearest first (what the gateway beside
	// it measured), and a version that changes with the order: the zone
	// is built again when it does, so DNS fails over where the gateway
	// does. Without it the service's locality order and then the
	// regions' names decide.
	Nearest func() (order []string, version uint64)
	// NSAddrs are the addresses published for ns.<zone>, the zone's name
	// server; none means ns.<zone> exists without address records.
	NSAddrs []netip.Addr
	// Forward sends names outside the zone to upstream resolvers.
	Forward ForwardConfig
	// Cache holds forwarded answers. It never holds zone answers, so a
	// projection change is visible in the very next reply.
	Cache CacheConfig
	// MaxUDPSize caps the size of UDP replies, whatever larger buffer a
	// client advertises; default DefaultMaxUDPSize. Bigger replies are
	// truncated with TC set and the client retries over TCP.
	MaxUDPSize int
	// MaxQuerySize drops queries larger than this many bytes; default
	// DefaultMaxQuerySize. A real query is well under 300 bytes.
	MaxQuerySize int
	// Registerer receives the Prometheus metrics; nil keeps them private.
	Registerer prometheus.Registerer
	// Logger; nil discards logs.
	Logger *zap.Logger
}

// NSAddrs parses the addresses published for ns.<zone>: explicit, or when
// none are given the listen hosts that are specific IPs (an unspecified
// address says nothing a client can reach). A bad one is named in the error.
func NSAddrs(explicit, listenHosts []string) ([]netip.Addr, error) {
	ns := explicit
	if len(ns) == 0 {
		for _, h := range listenHosts {
			if ip, err := netip.ParseAddr(h); err == nil && !ip.IsUnspecified() {
				ns = append(ns, h)
			}
		}
	}
	var out []netip.Addr
	for _, s := range ns {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, ip)
	}
	return out, nil
}

// Server is the DNS server: a query chain served on any number of UDP and
// TCP sockets. It is safe for concurrent use.
type Server struct {
	zone     string
	maxUDP   int
	maxQuery int
	chain    Handler
	fwd      *forwarder
	cache    *cache
	log      *zap.Logger
	m        *metrics

	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	servers []*dns.Server
	closed  bool
	wg      sync.WaitGroup
}

// New builds a server answering the zone from src. It opens no sockets and
// starts no goroutines until Serve.
func New(cfg Config, src Source) (*Server, error) {
	if src == nil {
		return nil, errors.New("creating dns server: no projection source")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("creating dns server: %w", err)
	}
	zone, _ := normalizeZone(cfg.Zone)
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxUDPSize == 0 {
		cfg.MaxUDPSize = DefaultMaxUDPSize
	}
	if cfg.MaxQuerySize == 0 {
		cfg.MaxQuerySize = DefaultMaxQuerySize
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{zone: zone, maxUDP: cfg.MaxUDPSize, maxQuery: cfg.MaxQuerySize, log: log, m: m}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	z := newZone(zone, cfg.Region, cfg.RegionFor, cfg.Nearest, cfg.TTL, cfg.NSAddrs, src, log, m)
	plugins := []Plugin{z.plugin}
	var last Handler = Refused{}
	if len(cfg.Forward.Upstreams) > 0 {
		s.fwd, err = newForwarder(cfg.Forward, log, m)
		if err != nil {
			return nil, fmt.Errorf("creating dns server: %w", err)
		}
		last = s.fwd
		if !cfg.Cache.Disabled {
			c, err := newCache(cfg.Cache, m)
			if err != nil {
				return nil, fmt.Errorf("creating dns server: %w", err)
			}
			s.cache = c
			plugins = append(plugins, c.plugin)
		}
	}
	s.chain = Chain(last, plugins...)
	return s, nil
}

// Validate checks cfg without side effects.
func (cfg Config) Validate() error {
	if _, err := normalizeZone(cfg.Zone); err != nil {
		return err
	}
	if cfg.Region != "" {
		if err := ValidRegion(cfg.Region); err != nil {
			return err
		}
	}
	if cfg.TTL != 0 && (cfg.TTL < time.Second || cfg.TTL > 24*time.Hour) {
		return fmt.Errorf("ttl %s: must be between 1s and 24h", cfg.TTL)
	}
	if cfg.MaxUDPSize != 0 && (cfg.MaxUDPSize < dns.MinMsgSize || cfg.MaxUDPSize > dns.MaxMsgSize) {
		return fmt.Errorf("max udp size %d: must be between %d and %d", cfg.MaxUDPSize, dns.MinMsgSize, dns.MaxMsgSize)
	}
	if cfg.MaxQuerySize != 0 && (cfg.MaxQuerySize < dns.MinMsgSize || cfg.MaxQuerySize > dns.MaxMsgSize) {
		return fmt.Errorf("max query size %d: must be between %d and %d", cfg.MaxQuerySize, dns.MinMsgSize, dns.MaxMsgSize)
	}
	if err := cfg.Forward.validate(); err != nil {
		return err
	}
	return cfg.Cache.validate()
}

// Zone is the zone the server is authoritative for, lower case with the
// trailing dot.
func (s *Server) Zone() string { return s.zone }

func normalizeZone(z string) (string, error) {
	if z == "" {
		return DefaultZone, nil
	}
	z = dns.Fqdn(lowerASCII(strings.TrimSpace(z)))
	if z == "." {
		return "", errors.New("zone: the root zone cannot be the cluster zone")
	}
	if _, ok := dns.IsDomainName(z); !ok {
		return "", fmt.Errorf("zone %q: not a domain name", z)
	}
	return z, nil
}

// Serve answers queries on pc (UDP) and ln (TCP); either may be nil. It
// returns once both are being served. Close stops them and closes them.
func (s *Server) Serve(pc net.PacketConn, ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("serving dns: server closed")
	}
	if s.fwd != nil && len(s.servers) == 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.fwd.healthLoop(s.ctx)
		}()
	}
	for _, sock := range []struct {
		pc net.PacketConn
		ln net.Listener
	}{{pc: pc}, {ln: ln}} {
		if sock.pc == nil && sock.ln == nil {
			continue
		}
		srv := &dns.Server{
			PacketConn:     sock.pc,
			Listener:       sock.ln,
			Handler:        s,
			UDPSize:        s.maxQuery + 1, // a longer datagram reads as maxQuery+1 bytes and is dropped
			ReadTimeout:    2 * time.Second,
			WriteTimeout:   2 * time.Second,
			MsgAcceptFunc:  acceptQuery,
			DecorateReader: func(r dns.Reader) dns.Reader { return &limitReader{Reader: r, max: s.maxQuery} },
		}
		started := make(chan struct{})
		failed := make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(started) }
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
				s.log.Error("dns server stopped", zap.String("addr", sockAddr(sock.pc, sock.ln)), zap.Error(err))
			}
		}()
		select {
		case <-started:
			s.servers = append(s.servers, srv)
		case err := <-failed:
			return fmt.Errorf("serving dns on %s: %w", sockAddr(sock.pc, sock.ln), err)
		}
	}
	return nil
}

func sockAddr(pc net.PacketConn, ln net.Listener) string {
	if pc != nil {
		return "udp/" + pc.LocalAddr().String()
	}
	return "tcp/" + ln.Addr().String()
}

// ListenAndServe opens a UDP and a TCP socket on the same address and
// serves them. With port 0 it picks a port free for both. It returns the
// address bound.
func (s *Server) ListenAndServe(addr string) (string, error) {
	if addr == "" {
		addr = DefaultListen
	}
	pc, ln, err := listenPair(addr)
	if err != nil {
		return "", err
	}
	if err := s.Serve(pc, ln); err != nil {
		pc.Close()
		ln.Close()
		return "", err
	}
	return pc.LocalAddr().String(), nil
}

func listenPair(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %q: %w", addr, err)
	}
	tries := 1
	if port == "0" {
		tries = 20 // the UDP port may be taken for TCP; pick another
	}
	for i := 0; ; i++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on udp %s: %w", addr, err)
		}
		_, p, _ := net.SplitHostPort(pc.LocalAddr().String())
		ln, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if i+1 >= tries {
			return nil, nil, fmt.Errorf("listening on tcp %s: %w", net.JoinHostPort(host, p), err)
		}
	}
}

// Close stops serving, closes the sockets given to Serve and stops the
// forwarder's health checks. In-flight queries get until ctx ends.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for _, srv := range servers {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.cancel()
	s.wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing dns server: %w", err)
	}
	return nil
}

// acceptQuery lets through only plain queries with one question and no
// records beyond an OPT (and room for one more, e.g. a TSIG we then
// ignore); others get FORMERR or NOTIMP before they are even unpacked.
func acceptQuery(dh dns.Header) dns.MsgAcceptAction {
	const qrBit = 1 << 15
	if dh.Bits&qrBit != 0 {
		return dns.MsgIgnore // a response: answering could loop or reflect
	}
	if opcode := int(dh.Bits>>11) & 0xF; opcode != dns.OpcodeQuery {
		return dns.MsgRejectNotImplemented
	}
	if dh.Qdcount != 1 || dh.Ancount != 0 || dh.Nscount != 0 || dh.Arcount > 2 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

var errQueryTooLarge = errors.New("query too large")

// limitReader drops queries longer than max bytes: a UDP datagram is
// skipped silently, a TCP connection sending one is closed.
type limitReader struct {
	dns.Reader
	max int
}

func (l *limitReader) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	m, err := l.Reader.ReadTCP(conn, timeout)
	if err == nil && len(m) > l.max {
		return nil, errQueryTooLarge
	}
	return m, err
}

func (l *limitReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, sess, err := l.Reader.ReadUDP(conn, timeout)
		if err != nil || len(m) <= l.max {
			return m, sess, err
		}
	}
}

func (l *limitReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	pr, ok := l.Reader.(dns.PacketConnReader)
	if !ok {
		return nil, nil, errors.New("reading dns: packet conns not supported")
	}
	for {
		m, addr, err := pr.ReadPacketConn(conn, timeout)
		if err != nil || len(m) <= l.max {
			return m, addr, err
		}
	}
}

// ServeDNS implements dns.Handler: it runs the chain and writes the reply.
func (s *Server) ServeDNS(rw dns.ResponseWriter, r *dns.Msg) {
	_, tcp := rw.LocalAddr().(*net.TCPAddr)
	w := &writer{ResponseWriter: rw, srv: s, req: r, tcp: tcp}
	var (
		rcode int
		err   error
		qtype uint16
	)
	opt := r.IsEdns0()
	if len(r.Question) == 1 {
		qtype = r.Question[0].Qtype
	}
	switch {
	case r.Response:
		return // never answer a response
	case len(r.Question) != 1:
		rcode = dns.RcodeFormatError
	case r.Opcode != dns.OpcodeQuery:
		rcode = dns.RcodeNotImplemented
	case opt != nil && opt.Version() != 0:
		rcode = dns.RcodeBadVers
	default:
		w.opt = opt
		rcode, err = s.chain.ServeDNS(s.ctx, w, r)
		if !w.written && clientWrite(rcode) {
			// A link claimed success without writing: a bug, not the client's.
			err = errors.Join(err, fmt.Errorf("handler returned rcode %d without a reply", rcode))
			rcode = dns.RcodeServerFailure
		}
	}
	if !w.written {
		w.opt = opt
		writeError(w, r, rcode)
	}
	s.m.countQuery(tcp, qtype, w.rcode)
	if err != nil {
		if c := s.log.Check(zapcore.DebugLevel, "dns query failed"); c != nil {
			c.Write(zap.String("question", r.Question[0].String()), zap.Int("rcode", rcode), zap.Error(err))
		}
	}
}

func writeError(w dns.ResponseWriter, r *dns.Msg, rcode int) {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	if rcode == dns.RcodeFormatError {
		m.Question = nil
	}
	_ = w.WriteMsg(m)
}

// writer sizes and encodes replies: it sets the OPT record the client
// gets, truncates UDP replies to the client's buffer (capped by
// MaxUDPSize) with TC set, and packs with compression.
type writer struct {
	dns.ResponseWriter
	srv     *Server
	req     *dns.Msg
	opt     *dns.OPT // the request's; nil when the client sent none
	tcp     bool
	written bool
	rcode   int
}

var errWritten = errors.New("dns reply already written")

var packBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

func (w *writer) WriteMsg(m *dns.Msg) error {
	if w.written {
		return errWritten
	}
	w.written = true
	m.Id = w.req.Id
	m.Response = true
	w.setEDNS(m)
	limit := dns.MaxMsgSize
	if !w.tcp {
		limit = dns.MinMsgSize
		if w.opt != nil {
			limit = max(dns.MinMsgSize, min(int(w.opt.UDPSize()), w.srv.maxUDP))
		}
	}
	bp := packBufs.Get().(*[]byte)
	defer packBufs.Put(bp)
	m.Compress = true
	out, err := m.PackBuffer((*bp)[:cap(*bp)])
	if err == nil && len(out) > limit {
		m.Truncate(limit)
		m.Compress = true
		out, err = m.PackBuffer((*bp)[:cap(*bp)])
	}
	if err != nil {
		// e.g. an upstream's extended rcode for a client without EDNS.
		fail := new(dns.Msg)
		fail.SetRcode(w.req, dns.RcodeServerFailure)
		w.setEDNS(fail)
		if out, err = fail.PackBuffer((*bp)[:cap(*bp)]); err != nil {
			return fmt.Errorf("packing dns reply: %w", err)
		}
		m = fail
	}
	if cap(out) > cap(*bp) && cap(out) <= dns.MaxMsgSize {
		*bp = out[:0]
	}
	w.rcode = m.Rcode
	_, err = w.ResponseWriter.Write(out)
	return err
}

// setEDNS replaces whatever OPT records m carries by ours when the client
// sent one (RFC 6891: no OPT in a reply to a query without one).
func (w *writer) setEDNS(m *dns.Msg) {
	has := false
	for _, rr := range m.Extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			has = true
			break
		}
	}
	if !has && w.opt == nil {
		return
	}
	// A fresh slice: m.Extra may share its array with the zone index.
	extra := make([]dns.RR, 0, len(m.Extra)+1)
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	if w.opt != nil {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(uint16(w.srv.maxUDP))
		if w.opt.Do() {
			o.SetDo()
		}
		extra = append(extra, o)
	}
	m.Extra = extra
}
