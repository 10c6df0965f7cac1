package wgbind

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/conn"
)

// RelayPrefix marks an endpoint reached through the relay: UAPI shows and
// takes "endpoint=relay/203.0.113.7:50000", the peer's relayed address.
const RelayPrefix = "relay/"

// ErrNoRelay is the reason a send to a relay endpoint fails while no relay
// is installed.
var ErrNoRelay = errors.New("no relay installed")

// relayRetry is how long the relay receiver waits before reading again
// after the relay failed with an error other than closing; a SetRelay
// wakes it sooner.
const relayRetry = time.Second

// IsRelayed reports whether a UAPI endpoint goes through the relay.
func IsRelayed(endpoint string) bool { return strings.HasPrefix(endpoint, RelayPrefix) }

// RelayEndpoint is a peer's address on the relay: another allocation's
// relayed address, which the installed relay conn writes to.
type RelayEndpoint struct{ netip.AddrPort }

func (RelayEndpoint) ClearSrc()             {}
func (RelayEndpoint) SrcToString() string   { return "" }
func (e RelayEndpoint) DstToString() string { return RelayPrefix + e.AddrPort.String() }
func (e RelayEndpoint) DstToBytes() []byte  { b, _ := e.AddrPort.MarshalBinary(); return b }
func (e RelayEndpoint) DstIP() netip.Addr   { return e.AddrPort.Addr() }
func (RelayEndpoint) SrcIP() netip.Addr     { return netip.Addr{} }

// relayState is the Demux's relay conn and its receiver's wake-ups.
type relayState struct {
	mu   sync.Mutex
	pc   net.PacketConn
	wake chan struct{} // closed and replaced whenever pc changes
	done chan struct{} // the current Open's; closed by Close
}

// wakeLocked returns the channel the next change closes.
func (r *relayState) wakeLocked() chan struct{} {
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

func (r *relayState) current() (net.PacketConn, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pc, r.wakeLocked()
}

// past is a read deadline that has passed: setting it wakes a blocked read.
var past = time.Unix(1, 0)

// SetRelay installs pc as the relay (nil removes it); it may be swapped at
// any time. The Demux reads everything pc receives, handing it to
// WireGuard as from a RelayEndpoint, and uses pc's read deadline to wake
// its reader on a swap and on Close, so nothing else should read pc or set
// its read deadline while it is installed (a conn it stops reading is left
// with a past read deadline). The caller keeps owning pc: remove it before
// closing it, or the receiver waits for the next SetRelay.
func (d *Demux) SetRelay(pc net.PacketConn) {
	r := &d.relay
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pc != nil {
		_ = r.pc.SetReadDeadline(past)
	}
	if pc != nil {
		// It may carry the past deadline of an earlier swap.
		_ = pc.SetReadDeadline(time.Time{})
	}
	r.pc = pc
	close(r.wakeLocked())
	r.wake = make(chan struct{})
}

// openRelay starts a receive generation; Close ends it.
func (d *Demux) openRelay() conn.ReceiveFunc {
	r := &d.relay
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		close(r.done)
	}
	r.done = make(chan struct{})
	if r.pc != nil {
		_ = r.pc.SetReadDeadline(time.Time{})
	}
	return d.receiveRelay(r.done)
}

// Close closes the inner bind and ends the relay receiver: it returns
// net.ErrClosed, as wireguard-go needs of every function Open returned.
func (d *Demux) Close() error {
	err := d.Bind.Close()
	r := &d.relay
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		close(r.done)
		r.done = nil
	}
	if r.pc != nil {
		_ = r.pc.SetReadDeadline(past)
	}
	return err
}

// receiveRelay reads one datagram at a time from whatever relay is
// installed, waiting while there is none.
func (d *Demux) receiveRelay(done <-chan struct{}) conn.ReceiveFunc {
	var then []func() // as in wrap
	return func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		runThen(&then)
		for {
			pc, wake := d.relay.current()
			select {
			case <-done:
				return 0, net.ErrClosed
			default:
			}
			if pc == nil {
				select {
				case <-done:
					return 0, net.ErrClosed
				case <-wake:
				}
				continue
			}
			n, from, err := pc.ReadFrom(packets[0])
			if err == nil {
				ap, ok := addrPortOf(from)
				if !ok {
					continue
				}
				if IsRelayProbe(packets[0][:n]) {
					if f := d.onRelayProbe.Load(); f != nil {
						(*f)(packets[0][:n])
					}
					continue
				}
				sizes[0], eps[0] = n, RelayEndpoint{ap}
				d.sawInitiation(packets[0][:n], &then)
				return 1, nil
			}
			// SetRelay and Close wake the read with a past deadline, and
			// then wake or done is closed. Otherwise the relay failed by
			// itself: a closed one waits for the next SetRelay, any other
			// error is retried a little later rather than in a spin.
			var retry *time.Timer
			var retryC <-chan time.Time
			if !errors.Is(err, net.ErrClosed) {
				retry = time.NewTimer(relayRetry)
				retryC = retry.C
			}
			select {
			case <-done:
			case <-wake:
			case <-retryC:
			}
			if retry != nil {
				retry.Stop()
			}
		}
	}
}

// relayProbeMagic starts a relay probe: a datagram a node sends through
// its own allocation to its own relayed address, to learn that the
// allocation still works (the relay forgets allocations when it restarts,
// and the client is not told). No WireGuard message starts with 0xff.
var relayProbeMagic = []byte{0xff, 'e', 'p', 'r', 'p'}

// IsRelayProbe says pkt is a relay probe.
func IsRelayProbe(pkt []byte) bool { return bytes.HasPrefix(pkt, relayProbeMagic) }

// RelayProbe is a relay probe carrying nonce.
func RelayProbe(nonce []byte) []byte {
	return append(append([]byte(nil), relayProbeMagic...), nonce...)
}

// OnRelayProbe installs f (nil: none), called with each relay probe the
// relay delivers, instead of handing it to WireGuard. The slice is only
// valid during the call; f must not block.
func (d *Demux) OnRelayProbe(f func(pkt []byte)) {
	if f == nil {
		d.onRelayProbe.Store(nil)
		return
	}
	d.onRelayProbe.Store(&f)
}

func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	var ap netip.AddrPort
	if ua, ok := a.(*net.UDPAddr); ok {
		ap = ua.AddrPort()
	} else if a != nil {
		ap, _ = netip.ParseAddrPort(a.String())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
}

// Send writes bufs to ep: through the relay for a RelayEndpoint, else on
// the inner bind (the direct path pays one type check).
func (d *Demux) Send(bufs [][]byte, ep conn.Endpoint) error {
	re, ok := ep.(RelayEndpoint)
	if !ok {
		return d.Bind.Send(bufs, ep)
	}
	d.relay.mu.Lock()
	pc := d.relay.pc
	d.relay.mu.Unlock()
	if pc == nil {
		return fmt.Errorf("sending to %s: %w", re.DstToString(), ErrNoRelay)
	}
	to := net.UDPAddrFromAddrPort(re.AddrPort)
	for _, b := range bufs {
		if _, err := pc.WriteTo(b, to); err != nil {
			return fmt.Errorf("sending to %s: %w", re.DstToString(), err)
		}
	}
	return nil
}

// ParseEndpoint parses "relay/ip:port" into a RelayEndpoint and leaves
// everything else to the inner bind.
func (d *Demux) ParseEndpoint(s string) (conn.Endpoint, error) {
	rest, ok := strings.CutPrefix(s, RelayPrefix)
	if !ok {
		return d.Bind.ParseEndpoint(s)
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil {
		return nil, fmt.Errorf("relay endpoint %q: %w", s, err)
	}
	return RelayEndpoint{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// Interface guards
var (
	_ conn.Bind     = (*Demux)(nil)
	_ conn.Endpoint = RelayEndpoint{}
)
