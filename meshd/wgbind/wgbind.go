// Package wgbind provides the UDP side of meshd's WireGuard device: a
// conn.Bind wrapper that lets STUN share the WireGuard socket (so the mapping
// STUN discovers is the WireGuard port's) and lets WireGuard reach peers
// through a TURN relay allocation (relay.go), and a Bind on one specific
// local address for boxes and tests that must not listen on 0.0.0.0.
package wgbind

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
)

// stunMagicCookie sits at bytes 4..8 of every RFC 5389 STUN message.
const stunMagicCookie = 0x2112A442

// IsSTUN is the cheap check that separates STUN from WireGuard on the shared
// socket. WireGuard messages start with a type byte (1..4) and three zero
// bytes; STUN binding messages have the two top bits clear, a non-zero
// second byte (the method's low bits) and the magic cookie. The two sets are
// disjoint, so a WireGuard packet is never taken for STUN.
func IsSTUN(b []byte) bool {
	return len(b) >= 20 && b[0]&0xC0 == 0 && b[1] != 0 &&
		binary.BigEndian.Uint32(b[4:8]) == stunMagicCookie
}

// STUNHandler receives a STUN packet that arrived on the WireGuard socket.
// The slice is only valid during the call.
type STUNHandler func(pkt []byte, from netip.AddrPort)

// Demux wraps a Bind: packets that pass IsSTUN go to the handler, the rest
// to WireGuard. The check is a few byte compares on packets WireGuard would
// read anyway, so the data path pays nothing measurable.
type Demux struct {
	conn.Bind
	handler atomic.Pointer[STUNHandler]
	// STUNPackets counts packets diverted to the handler.
	STUNPackets  atomic.Uint64
	onInitiation atomic.Pointer[func([]byte) func()]
	onRelayProbe atomic.Pointer[func([]byte)]
	relay        relayState
}

// initiationSize is the size of a WireGuard handshake initiation (type 1).
const initiationSize = device.MessageInitiationSize

// OnInitiation installs f (nil: none), called on the receive path with the
// packet, before WireGuard sees it, for each packet that looks like a
// handshake initiation: meshd reacts to a peer that switched keys before its
// data follows. f must not keep pkt or block. The then it returns (nil:
// none) runs on the same receive path before it reads again: WireGuard has
// the initiation and every packet read with it by then, and has answered
// none of the peer's data that the answer brings (it is not read yet).
func (d *Demux) OnInitiation(f func(pkt []byte) (then func())) {
	if f == nil {
		d.onInitiation.Store(nil)
		return
	}
	d.onInitiation.Store(&f)
}

// sawInitiation calls the OnInitiation hook if pkt looks like a handshake
// initiation, adds what it returned to then, and says whether pkt was one.
func (d *Demux) sawInitiation(pkt []byte, then *[]func()) bool {
	if len(pkt) != initiationSize || pkt[0] != 1 {
		return false
	}
	if f := d.onInitiation.Load(); f != nil {
		if t := (*f)(pkt); t != nil {
			*then = append(*then, t)
		}
	}
	return true
}

// runThen runs and clears what initiation hooks left for the next read.
func runThen(then *[]func()) {
	for _, t := range *then {
		t()
	}
	*then = (*then)[:0]
}

// NewDemux wraps inner.
func NewDemux(inner conn.Bind) *Demux { return &Demux{Bind: inner} }

// SetHandler installs h (nil drops STUN packets).
func (d *Demux) SetHandler(h STUNHandler) {
	if h == nil {
		d.handler.Store(nil)
		return
	}
	d.handler.Store(&h)
}

// Open opens the inner bind and wraps each receive function, and adds one
// that receives from the relay (see SetRelay).
func (d *Demux) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, actual, err := d.Bind.Open(port)
	if err != nil {
		return nil, 0, err
	}
	out := make([]conn.ReceiveFunc, len(fns), len(fns)+1)
	for i, fn := range fns {
		out[i] = d.wrap(fn)
	}
	return append(out, d.openRelay()), actual, nil
}

func (d *Demux) wrap(fn conn.ReceiveFunc) conn.ReceiveFunc {
	// then is only touched by the one goroutine WireGuard reads fn on.
	var then []func()
	return func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		runThen(&then)
		n, err := fn(packets, sizes, eps)
		for i := 0; i < n; i++ {
			if d.sawInitiation(packets[i][:sizes[i]], &then) {
				continue
			}
			if sizes[i] < 20 || !IsSTUN(packets[i][:sizes[i]]) {
				continue
			}
			d.STUNPackets.Add(1)
			if h := d.handler.Load(); h != nil && eps[i] != nil {
				if from, perr := netip.ParseAddrPort(eps[i].DstToString()); perr == nil {
					(*h)(packets[i][:sizes[i]], from)
				}
			}
			// WireGuard skips zero-sized entries.
			sizes[i] = 0
		}
		return n, err
	}
}

// SendTo sends one raw packet (a STUN request) from the WireGuard socket.
func (d *Demux) SendTo(pkt []byte, to netip.AddrPort) error {
	ep, err := d.Bind.ParseEndpoint(to.String())
	if err != nil {
		return err
	}
	return d.Bind.Send([][]byte{pkt}, ep)
}
