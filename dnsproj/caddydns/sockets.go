package caddydns

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// On Linux, Caddy's listener pool binds a fresh SO_REUSEPORT socket for each
// config and closes the old one at the end of a reload; the kernel throws
// away whatever sat in the old socket's queue, and a DNS query lost that way
// costs the client a multi-second retry. So the app keeps one socket pair
// per address for as long as any config uses it (a usage pool, the way
// caddymodule shares its projection), reads it in one loop, and hands each
// packet or connection to the newest server. A reload only switches the
// receiver; nothing is closed under a query.

var sockets = caddy.NewUsagePool()

// socketPair is one UDP socket and one TCP listener on the same address,
// shared by every config that serves DNS there.
type socketPair struct {
	pc  net.PacketConn
	ln  net.Listener
	log *zap.Logger

	mu  sync.Mutex
	udp *packetTarget // newest receiver, nil when none
	tcp *connTarget

	wg sync.WaitGroup
}

// acquireSockets returns the shared sockets of na (opening them through
// Caddy's listener facility on first use). Release with releaseSockets.
func acquireSockets(na caddy.NetworkAddress) (*socketPair, error) {
	key := na.JoinHostPort(0)
	val, _, err := sockets.LoadOrNew(key, func() (caddy.Destructor, error) {
		udp, tcp := na, na
		udp.Network, tcp.Network = "udp", "tcp"
		pc, err := listenAs[net.PacketConn](udp)
		if err != nil {
			return nil, err
		}
		ln, err := listenAs[net.Listener](tcp)
		if err != nil {
			pc.Close()
			return nil, err
		}
		// The process logger: the sockets outlive the config that opened them.
		s := &socketPair{pc: pc, ln: ln, log: caddy.Log().Named("edgeplane_dns.sockets")}
		s.wg.Add(2)
		go s.readLoop()
		go s.acceptLoop()
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return val.(*socketPair), nil
}

func releaseSockets(na caddy.NetworkAddress) error {
	_, err := sockets.Delete(na.JoinHostPort(0))
	return err
}

// Destruct closes the sockets once no config uses them.
func (s *socketPair) Destruct() error {
	err := errors.Join(s.pc.Close(), s.ln.Close())
	s.wg.Wait()
	return err
}

// serve makes fresh receivers the newest: the next packet or connection
// goes to them.
func (s *socketPair) serve() (*packetTarget, *connTarget) {
	pt := &packetTarget{pair: s, ch: make(chan packet, 1024), closed: make(chan struct{}), wake: make(chan struct{})}
	ct := &connTarget{pair: s, ch: make(chan net.Conn, 128), closed: make(chan struct{})}
	s.mu.Lock()
	s.udp, s.tcp = pt, ct
	s.mu.Unlock()
	return pt, ct
}

func (s *socketPair) currentUDP() *packetTarget {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp
}

func (s *socketPair) currentTCP() *connTarget {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tcp
}

type packet struct {
	b    []byte
	addr net.Addr
}

func (s *socketPair) readLoop() {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, addr, err := s.pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !errors.Is(err, net.ErrClosed) {
				s.log.Debug("dns udp socket closed", zap.Error(err))
			}
			return
		}
		s.dispatchPacket(packet{b: append([]byte(nil), buf[:n]...), addr: addr})
	}
}

// dispatchPacket hands p to the newest receiver; when its queue is full the
// packet is dropped, as the kernel would drop it from a full socket buffer.
func (s *socketPair) dispatchPacket(p packet) {
	t := s.currentUDP()
	if t == nil {
		return
	}
	select {
	case t.ch <- p:
	default:
	}
}

func (s *socketPair) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.dispatchConn(c)
	}
}

func (s *socketPair) dispatchConn(c net.Conn) {
	for {
		t := s.currentTCP()
		if t == nil {
			c.Close()
			return
		}
		select {
		case t.ch <- c:
			return
		case <-t.closed:
			// Raced with a reload: try the newer receiver.
			if s.currentTCP() == t {
				c.Close()
				return
			}
		}
	}
}

// packetTarget is the net.PacketConn one dns.Server reads: packets from the
// shared socket, replies written to it. Close drains what is queued to the
// newest receiver.
type packetTarget struct {
	pair   *socketPair
	ch     chan packet
	once   sync.Once
	closed chan struct{}

	mu       sync.Mutex
	deadline time.Time
	wake     chan struct{} // closed and replaced when the deadline changes
}

func (t *packetTarget) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		t.mu.Lock()
		deadline, wake := t.deadline, t.wake
		t.mu.Unlock()
		var timeout <-chan time.Time
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return 0, nil, os.ErrDeadlineExceeded
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case pkt := <-t.ch:
			return copy(p, pkt.b), pkt.addr, nil
		case <-t.closed:
			return 0, nil, net.ErrClosed
		case <-timeout:
			return 0, nil, os.ErrDeadlineExceeded
		case <-wake:
		}
	}
}

func (t *packetTarget) WriteTo(p []byte, addr net.Addr) (int, error) {
	return t.pair.pc.WriteTo(p, addr)
}
func (t *packetTarget) LocalAddr() net.Addr              { return t.pair.pc.LocalAddr() }
func (t *packetTarget) SetDeadline(d time.Time) error    { return t.SetReadDeadline(d) }
func (t *packetTarget) SetWriteDeadline(time.Time) error { return nil }

func (t *packetTarget) SetReadDeadline(d time.Time) error {
	t.mu.Lock()
	t.deadline = d
	close(t.wake)
	t.wake = make(chan struct{})
	t.mu.Unlock()
	return nil
}

func (t *packetTarget) Close() error {
	t.once.Do(func() {
		close(t.closed)
		s := t.pair
		s.mu.Lock()
		if s.udp == t {
			s.udp = nil
		}
		s.mu.Unlock()
		for {
			select {
			case p := <-t.ch:
				s.dispatchPacket(p)
			default:
				return
			}
		}
	})
	return nil
}

// connTarget is the net.Listener one dns.Server accepts from.
type connTarget struct {
	pair   *socketPair
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (t *connTarget) Accept() (net.Conn, error) {
	select {
	case c := <-t.ch:
		return &graceConn{Conn: c, target: t}, nil
	case <-t.closed:
		return nil, net.ErrClosed
	}
}

func (t *connTarget) Addr() net.Addr { return t.pair.ln.Addr() }

func (t *connTarget) Close() error {
	t.once.Do(func() {
		close(t.closed)
		s := t.pair
		s.mu.Lock()
		if s.tcp == t {
			s.tcp = nil
		}
		s.mu.Unlock()
		for {
			select {
			case c := <-t.ch:
				s.dispatchConn(c)
			default:
				return
			}
		}
	})
	return nil
}

// graceConn lets a reload hand over a connection its old server never
// read from: dns.Server stops by cutting every connection it holds, which
// would drop a client that connected just before the reload. Closing a
// connection with nothing read passes it to the newest server instead, its
// query still waiting in the socket. Connections that already sent a query
// are cut as usual, between queries (clients reconnect).
type graceConn struct {
	net.Conn
	target *connTarget
	read   atomic.Int64
	once   sync.Once
}

func (c *graceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *graceConn) Close() error {
	var err error
	c.once.Do(func() {
		select {
		case <-c.target.closed:
			if c.read.Load() == 0 {
				// The shutdown's read deadline lies in the past; the next
				// server sets its own before reading.
				c.target.pair.dispatchConn(c.Conn)
				return
			}
		default:
		}
		err = c.Conn.Close()
	})
	return err
}
