package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/turn/v4"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultRealm is the TURN realm of relays and clients that set none.
const DefaultRealm = "edgeplane"

// Default relayed port range: the IANA dynamic ports.
const (
	DefaultMinPort = 49152
	DefaultMaxPort = 65535
)

// portTries is how many random ports an allocation tries before giving up:
// with a range of thousands of ports, failing that often means it is full.
const portTries = 16

// closeWait bounds how long Close waits for pion to close the relayed
// sockets it closes from its own read loop.
const closeWait = 5 * time.Second

// ErrNotRelayPeer is the reason a relayed socket refuses to send to an
// address that is not a live allocation on the same relay.
var ErrNotRelayPeer = errors.New("peer is not an allocation on this relay")

// ServerConfig configures a relay.
type ServerConfig struct {
	// Listen is the UDP host:port the relay serves TURN (and STUN binding)
	// on. An IPv4 address: pion/turn relays IPv4 only. Unused by Serve.
	Listen string
	// RelayIP is the address given to relayed allocations: the box's
	// address that nodes reach. Default: Listen's IP; required when that
	// is a wildcard. Relayed sockets bind to Listen's IP, so RelayIP is a
	// local address or one a NAT forwards (and hairpins) to it.
	RelayIP netip.Addr
	// Secret is the shared secret of the TURN REST credentials (see
	// Credentials). Required.
	Secret []byte
	// Realm is the TURN realm. Default "edgeplane".
	Realm string
	// MinPort and MaxPort bound the relayed ports, inclusive. Default
	// 49152..65535.
	MinPort, MaxPort uint16
	// Logger receives the relay's logs and pion's (at Debug; its warnings
	// and errors at Warn). Default: none.
	Logger *zap.Logger
	// ListenPacket opens a relayed socket. Default net.ListenPacket; a
	// caller serving inside another network namespace passes one that
	// opens sockets there, since pion opens them from its own goroutines.
	ListenPacket func(network, address string) (net.PacketConn, error)
}

// Stats are a relay's counters, for metrics.
type Stats struct {
	// Allocations is the number of allocations alive now.
	Allocations int
	// Packets and Bytes count datagrams relayed from one allocation to
	// another.
	Packets, Bytes uint64
	// Refused counts permissions, channel binds and datagrams refused
	// because the peer is not an allocation on this relay.
	Refused uint64
	// AuthFailures counts requests with wrong or expired credentials.
	AuthFailures uint64
}

// Server is a running relay.
type Server struct {
	turn    *turn.Server
	conn    net.PacketConn
	cfg     ServerConfig // defaults filled
	bindIP  netip.Addr   // what relayed sockets bind to
	relayIP netip.Addr
	log     *zap.Logger

	mu      sync.RWMutex
	ports   map[uint16]int // live relayed ports, counted: a port closes before it is released
	closing bool
	drained chan struct{} // closed once closing and no relayed port is left

	packets, bytes, refused, authFailures atomic.Uint64

	done     chan struct{}
	once     sync.Once
	closeErr error
}

// Listen opens cfg.Listen and serves until ctx ends or Close is called.
func Listen(ctx context.Context, cfg ServerConfig) (*Server, error) {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp4", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay: listening on %s: %w", cfg.Listen, err)
	}
	return Serve(ctx, pc.(*net.UDPConn), cfg)
}

// Serve serves on an already-open socket (for callers that open it in a
// specific network namespace) until ctx ends or Close is called. The
// server owns c from now on, also when Serve fails.
func Serve(ctx context.Context, c *net.UDPConn, cfg ServerConfig) (*Server, error) {
	s, err := newServer(c, cfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	authLog := pionLogger{l: s.log.Named("auth"), max: zapcore.DebugLevel}
	auth := turn.LongTermTURNRESTAuthHandler(string(s.cfg.Secret), authLog)
	s.turn, err = turn.NewServer(turn.ServerConfig{
		Realm:         s.cfg.Realm,
		LoggerFactory: pionLogs{s.log},
		AuthHandler: func(username, realm string, src net.Addr) ([]byte, bool) {
			key, ok := auth(username, realm, src)
			if !ok {
				s.authFailures.Add(1)
			}
			return key, ok
		},
		EventHandler: turn.EventHandler{
			OnAuth: func(src, _ net.Addr, _, username, _, method string, ok bool) {
				if !ok {
					// A wrong password: the handler above saw a valid username.
					s.authFailures.Add(1)
					s.log.Debug("credentials refused", zap.Stringer("client", src), zap.String("username", username), zap.String("method", method))
				}
			},
			OnAllocationCreated: func(src, _ net.Addr, _, username, _ string, relayed net.Addr, _ int) {
				s.log.Debug("allocation created", zap.Stringer("client", src), zap.String("username", username), zap.Stringer("relayed", relayed))
			},
			OnAllocationDeleted: func(src, _ net.Addr, _, username, _ string) {
				s.log.Debug("allocation deleted", zap.Stringer("client", src), zap.String("username", username))
			},
		},
		PacketConnConfigs: []turn.PacketConnConfig{{
			PacketConn:            c,
			RelayAddressGenerator: relayPorts{s},
			PermissionHandler:     s.permit,
		}},
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("relay: starting TURN server on %s: %w", c.LocalAddr(), err)
	}
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	s.log.Info("relay serving", zap.Stringer("addr", s.Addr()), zap.Stringer("relay_ip", s.relayIP),
		zap.Uint16("min_port", s.cfg.MinPort), zap.Uint16("max_port", s.cfg.MaxPort))
	return s, nil
}

// newServer checks cfg against the socket and fills its defaults.
func newServer(c *net.UDPConn, cfg ServerConfig) (*Server, error) {
	local := c.LocalAddr().(*net.UDPAddr).AddrPort()
	bindIP := local.Addr().Unmap()
	switch {
	case bindIP.IsUnspecified():
		bindIP = netip.IPv4Unspecified()
	case !bindIP.Is4():
		return nil, fmt.Errorf("relay: listening on %s: pion/turn relays IPv4 only", local)
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("relay: no secret for the credentials")
	}
	if cfg.Realm == "" {
		cfg.Realm = DefaultRealm
	}
	if cfg.MinPort == 0 && cfg.MaxPort == 0 {
		cfg.MinPort, cfg.MaxPort = DefaultMinPort, DefaultMaxPort
	}
	if cfg.MinPort == 0 || cfg.MinPort > cfg.MaxPort {
		return nil, fmt.Errorf("relay: port range %d-%d is empty", cfg.MinPort, cfg.MaxPort)
	}
	relayIP := cfg.RelayIP.Unmap()
	if !relayIP.IsValid() {
		if bindIP.IsUnspecified() {
			return nil, fmt.Errorf("relay: listening on the wildcard %s needs a RelayIP (the address nodes reach the box at)", local)
		}
		relayIP = bindIP
	}
	if !relayIP.Is4() || relayIP.IsUnspecified() {
		return nil, fmt.Errorf("relay: relay IP %s: want a concrete IPv4 address (pion/turn relays IPv4 only)", relayIP)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ListenPacket == nil {
		cfg.ListenPacket = net.ListenPacket
	}
	return &Server{
		conn:    c,
		cfg:     cfg,
		bindIP:  bindIP,
		relayIP: relayIP,
		log:     cfg.Logger,
		ports:   make(map[uint16]int),
		drained: make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// Addr is the address the relay serves TURN on.
func (s *Server) Addr() netip.AddrPort {
	ap := s.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// RelayIP is the address of the relay's allocations.
func (s *Server) RelayIP() netip.Addr { return s.relayIP }

// Stats returns the relay's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Allocations:  s.turn.AllocationCount(),
		Packets:      s.packets.Load(),
		Bytes:        s.bytes.Load(),
		Refused:      s.refused.Load(),
		AuthFailures: s.authFailures.Load(),
	}
}

// Close stops the relay and closes its allocations.
func (s *Server) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.mu.Lock()
		s.closing = true
		s.drainedLocked()
		s.mu.Unlock()
		if err := s.turn.Close(); err != nil {
			s.closeErr = fmt.Errorf("relay: closing: %w", err)
		}
		// pion closes the allocations from its read loop once the socket
		// is closed; wait for that so no relayed socket outlives Close.
		t := time.NewTimer(closeWait)
		defer t.Stop()
		select {
		case <-s.drained:
		case <-t.C:
			s.log.Warn("relay: relayed sockets still open after close", zap.Duration("waited", closeWait))
		}
	})
	return s.closeErr
}

// permit is pion's PermissionHandler: a client may open permissions and
// channels only to the relay's own address, so it reaches other
// allocations here and nothing else. pion checks IPs only; relayConn
// checks ports.
func (s *Server) permit(client net.Addr, peer net.IP) bool {
	ip, ok := netip.AddrFromSlice(peer)
	if ok && ip.Unmap() == s.relayIP {
		return true
	}
	s.refused.Add(1)
	s.log.Debug("permission refused: peer is not this relay", zap.Stringer("client", client), zap.Stringer("peer", peer))
	return false
}

// isRelayPeer reports whether addr is a live allocation on this relay.
func (s *Server) isRelayPeer(addr net.Addr) bool {
	ua, ok := addr.(*net.UDPAddr)
	if !ok || ua.Port <= 0 || ua.Port > 65535 {
		return false
	}
	ip, ok := netip.AddrFromSlice(ua.IP)
	if !ok || ip.Unmap() != s.relayIP {
		return false
	}
	s.mu.RLock()
	_, live := s.ports[uint16(ua.Port)]
	s.mu.RUnlock()
	return live
}

func (s *Server) holdPort(port uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.ports[port]++
	return true
}

func (s *Server) releasePort(port uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ports[port]--; s.ports[port] <= 0 {
		delete(s.ports, port)
	}
	s.drainedLocked()
}

func (s *Server) drainedLocked() {
	if s.closing && len(s.ports) == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
}

// relayPorts is the pion RelayAddressGenerator: relayed sockets on the
// listen IP within the port range, advertised at RelayIP, each wrapped in
// a relayConn.
type relayPorts struct{ s *Server }

func (relayPorts) Validate() error { return nil }

func (g relayPorts) AllocatePacketConn(network string, requested int) (net.PacketConn, net.Addr, error) {
	s := g.s
	if requested != 0 {
		if requested < int(s.cfg.MinPort) || requested > int(s.cfg.MaxPort) {
			return nil, nil, fmt.Errorf("requested relay port %d is outside %d-%d", requested, s.cfg.MinPort, s.cfg.MaxPort)
		}
		return g.open(network, uint16(requested))
	}
	span := int(s.cfg.MaxPort) - int(s.cfg.MinPort) + 1
	var err error
	for range portTries {
		var pc net.PacketConn
		var addr net.Addr
		pc, addr, err = g.open(network, s.cfg.MinPort+uint16(rand.IntN(span)))
		if err == nil {
			return pc, addr, nil
		}
	}
	return nil, nil, fmt.Errorf("no free relay port in %d-%d after %d tries: %w", s.cfg.MinPort, s.cfg.MaxPort, portTries, err)
}

func (g relayPorts) open(network string, port uint16) (net.PacketConn, net.Addr, error) {
	s := g.s
	at := netip.AddrPortFrom(s.bindIP, port).String()
	pc, err := s.cfg.ListenPacket(network, at)
	if err != nil {
		return nil, nil, fmt.Errorf("opening relayed socket %s: %w", at, err)
	}
	if !s.holdPort(port) {
		pc.Close()
		return nil, nil, net.ErrClosed
	}
	return &relayConn{PacketConn: pc, s: s, port: port}, net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.relayIP, port)), nil
}

func (relayPorts) AllocateConn(string, int) (net.Conn, net.Addr, error) {
	return nil, nil, errors.New("TCP relaying is not offered")
}

// relayConn is a relayed socket that writes only to other allocations on
// the relay: pion's permission check looks at the IP alone, which would
// let a client reach any UDP service on the relay's address.
type relayConn struct {
	net.PacketConn
	s    *Server
	port uint16
	once sync.Once
}

func (c *relayConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	if !c.s.isRelayPeer(addr) {
		c.s.refused.Add(1)
		return 0, fmt.Errorf("relaying to %v: %w", addr, ErrNotRelayPeer)
	}
	n, err := c.PacketConn.WriteTo(p, addr)
	if err == nil {
		c.s.packets.Add(1)
		c.s.bytes.Add(uint64(n))
	}
	return n, err
}

func (c *relayConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		// Close before releasing: the port cannot be taken again until
		// closed, and the count keeps a reopened port held.
		err = c.PacketConn.Close()
		c.s.releasePort(c.port)
	})
	return err
}

// Interface guards
var (
	_ turn.RelayAddressGenerator = relayPorts{}
	_ net.PacketConn             = (*relayConn)(nil)
)
