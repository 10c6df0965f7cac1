package wgbind

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
)

// SocketBuffer is the send and receive buffer size meshd asks for. Without
// large buffers wireguard-go bulk throughput collapses (measured ~50 MiB/s
// down to 1.5 MiB/s); SO_*BUFFORCE passes net.core.rmem_max as root.
const SocketBuffer = 7 << 20

// RaiseBuffers sets large socket buffers on a raw connection, forcing past
// rmem_max/wmem_max when the process has CAP_NET_ADMIN.
func RaiseBuffers(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{unix.SO_RCVBUF, unix.SO_RCVBUFFORCE}, {unix.SO_SNDBUF, unix.SO_SNDBUFFORCE}} {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], SocketBuffer)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], SocketBuffer)
		}
	})
}

// AddrBind is a conn.Bind on one local address (instead of conn.StdNetBind's
// 0.0.0.0 and [::]), reading and writing in batches (recvmmsg/sendmmsg).
type AddrBind struct {
	addr netip.Addr

	mu   sync.Mutex
	uc   *net.UDPConn
	pc4  *ipv4.PacketConn
	pc6  *ipv6.PacketConn
	msgs sync.Pool
}

// NewAddrBind returns a Bind that listens on addr only.
func NewAddrBind(addr netip.Addr) *AddrBind {
	b := &AddrBind{addr: addr.Unmap()}
	b.msgs.New = func() any {
		m := make([]ipv4.Message, conn.IdealBatchSize)
		for i := range m {
			m[i].Buffers = make(net.Buffers, 1)
		}
		return &m
	}
	return b
}

// Endpoint is a peer address for AddrBind.
type Endpoint struct{ netip.AddrPort }

func (Endpoint) ClearSrc()             {}
func (Endpoint) SrcToString() string   { return "" }
func (e Endpoint) DstToString() string { return e.AddrPort.String() }
func (e Endpoint) DstToBytes() []byte  { b, _ := e.AddrPort.MarshalBinary(); return b }
func (e Endpoint) DstIP() netip.Addr   { return e.AddrPort.Addr() }
func (Endpoint) SrcIP() netip.Addr     { return netip.Addr{} }

// Open binds addr:port.
func (b *AddrBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uc != nil {
		return nil, 0, conn.ErrBindAlreadyOpen
	}
	network := "udp4"
	if b.addr.Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error { RaiseBuffers(rc); return nil }}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(b.addr, port).String())
	if err != nil {
		return nil, 0, fmt.Errorf("binding %s: %w", netip.AddrPortFrom(b.addr, port), err)
	}
	uc := pc.(*net.UDPConn)
	b.uc = uc
	if b.addr.Is4() {
		b.pc4 = ipv4.NewPacketConn(uc)
	} else {
		b.pc6 = ipv6.NewPacketConn(uc)
	}
	actual := uint16(uc.LocalAddr().(*net.UDPAddr).Port)
	return []conn.ReceiveFunc{b.receive}, actual, nil
}

func (b *AddrBind) conns() (*net.UDPConn, *ipv4.PacketConn, *ipv6.PacketConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.uc, b.pc4, b.pc6
}

func (b *AddrBind) receive(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
	uc, pc4, pc6 := b.conns()
	if uc == nil {
		return 0, net.ErrClosed
	}
	mp := b.msgs.Get().(*[]ipv4.Message)
	defer b.msgs.Put(mp)
	msgs := (*mp)[:len(packets)]
	for i := range msgs {
		msgs[i].Buffers[0] = packets[i]
		msgs[i].N, msgs[i].Addr = 0, nil
	}
	var n int
	var err error
	if pc4 != nil {
		n, err = pc4.ReadBatch(msgs, 0)
	} else {
		n, err = pc6.ReadBatch(msgs, 0)
	}
	if err != nil {
		return 0, err
	}
	for i := 0; i < n; i++ {
		sizes[i] = msgs[i].N
		ua, _ := msgs[i].Addr.(*net.UDPAddr)
		if ua == nil {
			sizes[i] = 0
			continue
		}
		ap := ua.AddrPort()
		eps[i] = Endpoint{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
	}
	return n, nil
}

// Close closes the socket; pending receives return net.ErrClosed.
func (b *AddrBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uc == nil {
		return nil
	}
	err := b.uc.Close()
	b.uc, b.pc4, b.pc6 = nil, nil, nil
	return err
}

// SetMark sets SO_MARK on the socket.
func (b *AddrBind) SetMark(mark uint32) error {
	uc, _, _ := b.conns()
	if uc == nil {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark)) }); err != nil {
		return err
	}
	return serr
}

// Send writes bufs to ep in one batch.
func (b *AddrBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	uc, pc4, pc6 := b.conns()
	if uc == nil {
		return net.ErrClosed
	}
	e, ok := ep.(Endpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	ua := net.UDPAddrFromAddrPort(e.AddrPort)
	mp := b.msgs.Get().(*[]ipv4.Message)
	defer b.msgs.Put(mp)
	msgs := (*mp)[:len(bufs)]
	for i := range msgs {
		msgs[i].Buffers[0] = bufs[i]
		msgs[i].Addr = ua
	}
	for len(msgs) > 0 {
		var n int
		var err error
		if pc4 != nil {
			n, err = pc4.WriteBatch(msgs, 0)
		} else {
			n, err = pc6.WriteBatch(msgs, 0)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			return fmt.Errorf("sending to %s: %w", e.AddrPort, err)
		}
		msgs = msgs[n:]
	}
	return nil
}

// ParseEndpoint parses ip:port.
func (b *AddrBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return Endpoint{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// BatchSize is the number of packets per read and write.
func (b *AddrBind) BatchSize() int { return conn.IdealBatchSize }

var _ conn.Bind = (*AddrBind)(nil)
