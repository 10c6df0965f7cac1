package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/stun/v3"
	"github.com/pion/turn/v4"
	"go.uber.org/zap"
)

// permRefresh is how often an allocation renews its permission for the
// relay's address: TURN permissions last 5 minutes (RFC 8656 section 9).
const permRefresh = 2 * time.Minute

// permTries covers a stale nonce: the first try learns the new nonce.
const permTries = 3

// ErrCredentials is the reason an allocation is refused for its username
// or password (wrong, or expired).
var ErrCredentials = errors.New("relay refused the credentials (wrong password or expired)")

// ClientConfig configures an allocation.
type ClientConfig struct {
	// Server is the relay's host:port (IPv4).
	Server string
	// Username and Password are TURN REST credentials (see Credentials).
	Username, Password string
	// Realm is the TURN realm. Default "edgeplane"; the relay's own realm
	// wins, as TURN has the client take it from the relay's challenge.
	Realm string
	// Local is the local UDP address of the socket to the relay. Default
	// ":0".
	Local string
	// Logger receives the client's logs and pion's (at Debug; its warnings
	// and errors at Warn). Default: none.
	Logger *zap.Logger
}

// Allocation is one relayed address on a relay; a net.PacketConn whose
// ReadFrom and WriteTo carry datagrams to and from other allocations on the
// same relay. pion refreshes the allocation and the permissions it uses;
// Close releases the allocation and everything it runs.
type Allocation struct {
	relayed net.PacketConn // pion's relayed conn
	client  *turn.Client
	conn    net.PacketConn // socket to the relay
	server  netip.AddrPort
	addr    netip.AddrPort // relayed address
	log     *zap.Logger

	done      chan struct{} // closed by Close
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Allocate gets a relayed address on the relay at cfg.Server. It opens the
// allocation's permission for the relay's own address, so datagrams from
// every other allocation on the relay arrive before this side has sent
// them anything (the relay refuses all other peers anyway). Allocate gives
// up when ctx ends.
func Allocate(ctx context.Context, cfg ClientConfig) (*Allocation, error) {
	if cfg.Server == "" {
		return nil, errors.New("relay: no server to allocate on")
	}
	if cfg.Realm == "" {
		cfg.Realm = DefaultRealm
	}
	if cfg.Local == "" {
		cfg.Local = ":0"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	server, err := resolve(ctx, cfg.Server)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	conn, err := lc.ListenPacket(ctx, "udp4", cfg.Local)
	if err != nil {
		return nil, fmt.Errorf("relay %s: opening local socket %s: %w", cfg.Server, cfg.Local, err)
	}
	client, err := turn.NewClient(&turn.ClientConfig{
		TURNServerAddr: server.String(),
		Username:       cfg.Username,
		Password:       cfg.Password,
		Realm:          cfg.Realm,
		Conn:           conn,
		LoggerFactory:  pionLogs{cfg.Logger},
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("relay %s: creating TURN client: %w", cfg.Server, err)
	}
	a := &Allocation{client: client, conn: conn, server: server, log: cfg.Logger, done: make(chan struct{})}
	a.wg.Add(1)
	go a.readLoop()

	// pion's Allocate and CreatePermission block on their transactions
	// (retransmitting for about 8 s) and take no context, so they run here
	// and ctx cuts them short by closing the socket and the transactions;
	// the goroutine then returns and is waited for.
	type result struct {
		relayed net.PacketConn
		err     error
	}
	ch := make(chan result, 1)
	go func() {
		relayed, err := client.Allocate()
		if err == nil {
			err = a.permitRelay(relayed)
		}
		ch <- result{relayed, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		a.shutdown()
		if r = <-ch; r.relayed != nil {
			r.relayed.Close() // stops its refresh timers
		}
		a.wg.Wait()
		return nil, fmt.Errorf("relay %s: no allocation: %w", cfg.Server, ctx.Err())
	}
	if r.err != nil {
		if r.relayed != nil {
			r.relayed.Close()
		}
		a.shutdown()
		a.wg.Wait()
		var te *stun.TurnError
		if errors.As(r.err, &te) && (te.ErrorCodeAttr.Code == stun.CodeBadRequest || te.ErrorCodeAttr.Code == stun.CodeUnauthorized) {
			// pion answers 400 to a bad password or an expired username.
			return nil, fmt.Errorf("relay %s: allocating as %q: %w: %v", cfg.Server, cfg.Username, ErrCredentials, r.err)
		}
		return nil, fmt.Errorf("relay %s: allocating as %q: %w", cfg.Server, cfg.Username, r.err)
	}
	a.relayed = r.relayed
	a.addr = addrPort(r.relayed.LocalAddr())
	a.wg.Add(1)
	go a.keepPermission()
	a.log.Debug("relay allocation", zap.Stringer("server", server), zap.Stringer("relayed", a.addr))
	return a, nil
}

func resolve(ctx context.Context, hostport string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("relay %q: %w", hostport, err)
	}
	// pion/turn resolves servers as udp4: IPv4 only.
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("relay %s: resolving %s: %w", hostport, host, err)
	}
	p, err := net.DefaultResolver.LookupPort(ctx, "udp", port)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("relay %s: port: %w", hostport, err)
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(p)), nil
}

// permitRelay opens the permission for the relay's own address, which is
// every other allocation's, retrying once the nonce has gone stale.
func (a *Allocation) permitRelay(relayed net.PacketConn) error {
	peer := net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrPort(relayed.LocalAddr()).Addr(), 0))
	var err error
	for range permTries {
		if err = a.client.CreatePermission(peer); err == nil {
			return nil
		}
	}
	return fmt.Errorf("opening the permission for %s: %w", peer.IP, err)
}

func (a *Allocation) keepPermission() {
	defer a.wg.Done()
	t := time.NewTicker(permRefresh)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			return
		case <-t.C:
			if err := a.permitRelay(a.relayed); err != nil {
				select {
				case <-a.done:
					return
				default:
				}
				a.log.Warn("relay: renewing permission", zap.Stringer("server", a.server), zap.Error(err))
			}
		}
	}
}

// readLoop hands what the relay sends to the client. It replaces pion's
// Client.Listen, whose loop ends for good on the first malformed packet
// and cannot be waited for, and it drops packets from anyone but the
// relay: Data indications carry no integrity.
func (a *Allocation) readLoop() {
	defer a.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := a.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if addrPort(from) != a.server {
			continue
		}
		if _, err := a.client.HandleInbound(buf[:n], from); err != nil {
			a.log.Debug("relay: handling packet from relay", zap.Stringer("server", a.server), zap.Error(err))
		}
	}
}

// shutdown closes the socket and pending transactions.
func (a *Allocation) shutdown() {
	a.conn.Close()
	a.client.Close()
}

// RelayedAddr is the allocation's address on the relay: where the relay's
// other allocations send to reach it.
func (a *Allocation) RelayedAddr() netip.AddrPort { return a.addr }

// Server is the relay's address.
func (a *Allocation) Server() netip.AddrPort { return a.server }

// ReadFrom reads a datagram another allocation sent to this one. After
// Close it returns net.ErrClosed.
func (a *Allocation) ReadFrom(p []byte) (int, net.Addr, error) {
	n, from, err := a.relayed.ReadFrom(p)
	if err != nil {
		return n, from, a.closedErr(err)
	}
	return n, from, nil
}

// WriteTo sends p to another allocation on the relay. The first datagram
// to a new peer IP waits for the relay to grant the permission.
func (a *Allocation) WriteTo(p []byte, addr net.Addr) (int, error) {
	if _, ok := addr.(*net.UDPAddr); !ok {
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return 0, fmt.Errorf("relay %s: sending to %v: %w", a.server, addr, err)
		}
		addr = net.UDPAddrFromAddrPort(ap)
	}
	n, err := a.relayed.WriteTo(p, addr)
	if err != nil {
		return n, fmt.Errorf("relay %s: sending to %v: %w", a.server, addr, a.closedErr(err))
	}
	return n, nil
}

// closedErr turns pion's own "closed" error into net.ErrClosed.
func (a *Allocation) closedErr(err error) error {
	select {
	case <-a.done:
		return net.ErrClosed
	default:
		return err
	}
}

// Close releases the allocation on the relay and stops its refreshes.
func (a *Allocation) Close() error {
	a.closeOnce.Do(func() {
		close(a.done)
		// Sends the deallocation (a Refresh with lifetime 0) without
		// waiting for the answer; should it be lost, the relay drops the
		// allocation when its lifetime runs out.
		if err := a.relayed.Close(); err != nil {
			a.closeErr = fmt.Errorf("relay %s: releasing %s: %w", a.server, a.addr, err)
		}
		a.shutdown()
		a.wg.Wait()
	})
	return a.closeErr
}

// LocalAddr is the relayed address.
func (a *Allocation) LocalAddr() net.Addr { return a.relayed.LocalAddr() }

// SetDeadline sets the read deadline (writes never block on the network).
func (a *Allocation) SetDeadline(t time.Time) error { return a.relayed.SetDeadline(t) }

// SetReadDeadline sets the deadline for pending and future ReadFrom calls.
func (a *Allocation) SetReadDeadline(t time.Time) error { return a.relayed.SetReadDeadline(t) }

// SetWriteDeadline does nothing: writes never block on the network.
func (a *Allocation) SetWriteDeadline(t time.Time) error { return a.relayed.SetWriteDeadline(t) }

func addrPort(a net.Addr) netip.AddrPort {
	if ua, ok := a.(*net.UDPAddr); ok {
		ap := ua.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// Interface guards
var _ net.PacketConn = (*Allocation)(nil)
