package wgbind_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/curve25519"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/relay/relaytest"
	"github.com/edgeplane/edgeplane/meshd/wgbind"
)

var relaySecret = []byte("wgbind relay test secret")

var loopback = netip.MustParseAddr("127.0.0.1")

func TestRelayEndpoints(t *testing.T) {
	d := wgbind.NewDemux(wgbind.NewAddrBind(loopback))
	for in, want := range map[string]string{
		"relay/203.0.113.7:50000":      "relay/203.0.113.7:50000",
		"relay/[2001:db8::1]:50000":    "relay/[2001:db8::1]:50000",
		"relay/[::ffff:192.0.2.1]:500": "relay/192.0.2.1:500",
		"192.0.2.1:51820":              "192.0.2.1:51820",
	} {
		ep, err := d.ParseEndpoint(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := ep.DstToString(); got != want {
			t.Errorf("%s: DstToString %q, want %q", in, got, want)
		}
		if _, relayed := ep.(wgbind.RelayEndpoint); relayed != wgbind.IsRelayed(in) || wgbind.IsRelayed(want) != relayed {
			t.Errorf("%s: relay endpoint %v, IsRelayed %v", in, relayed, wgbind.IsRelayed(in))
		}
	}
	for _, bad := range []string{"relay/", "relay/203.0.113.7", "relay/host:1", "nonsense"} {
		if _, err := d.ParseEndpoint(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	ep, _ := d.ParseEndpoint("relay/203.0.113.7:50000")
	if err := d.Send([][]byte{{1}}, ep); !errors.Is(err, wgbind.ErrNoRelay) {
		t.Fatalf("send without relay: %v, want ErrNoRelay", err)
	}
}

type received struct {
	data string
	from conn.Endpoint
	err  error
}

// receiveAll runs fn until it fails, passing on what it yields.
func receiveAll(fn conn.ReceiveFunc) <-chan received {
	out := make(chan received, 16)
	go func() {
		defer close(out)
		bufs := [][]byte{make([]byte, 1500)}
		sizes, eps := make([]int, 1), make([]conn.Endpoint, 1)
		for {
			n, err := fn(bufs, sizes, eps)
			if err != nil {
				out <- received{err: err}
				return
			}
			for i := range n {
				out <- received{data: string(bufs[i][:sizes[i]]), from: eps[i]}
			}
		}
	}()
	return out
}

// expectClosed waits for the receiver to end with net.ErrClosed, as
// wireguard-go needs after the bind's Close.
// closeAndReopen closes d, checks the relay receiver got (its last Open's)
// ended, opens d again and returns the new relay receiver's packets.
func closeAndReopen(t *testing.T, d *wgbind.Demux, got <-chan received) <-chan received {
	t.Helper()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, got)
	fns, _, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	return receiveAll(fns[len(fns)-1])
}

func expectClosed(t *testing.T, got <-chan received) {
	t.Helper()
	select {
	case r := <-got:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("after Close the receiver gave %+v, want net.ErrClosed", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("relay receiver still blocked after Close")
	}
}

// expect resends payload from one allocation to addr until the receiver
// yields it.
func expect(t *testing.T, got <-chan received, from *relay.Allocation, to netip.AddrPort, payload string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	resend := time.NewTicker(100 * time.Millisecond)
	defer resend.Stop()
	for {
		if _, err := from.WriteTo([]byte(payload), net.UDPAddrFromAddrPort(to)); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("receiver ended waiting for %q: %v", payload, r.err)
			}
			if r.data != payload {
				continue // an earlier resend
			}
			if want := wgbind.RelayPrefix + from.RelayedAddr().String(); r.from.DstToString() != want {
				t.Fatalf("%q from %s, want %s", payload, r.from.DstToString(), want)
			}
			return
		case <-resend.C:
		case <-deadline:
			t.Fatalf("%q never arrived", payload)
		}
	}
}

// The relay receiver waits for a relay, follows swaps, survives the
// installed allocation closing under it, and ends promptly on Close.
func TestRelayReceiverSwapAndClose(t *testing.T) {
	s := relaytest.Start(t, relaySecret)
	a, b, c := relaytest.Allocate(t, s, relaySecret, "a"), relaytest.Allocate(t, s, relaySecret, "b"), relaytest.Allocate(t, s, relaySecret, "c")
	d := wgbind.NewDemux(wgbind.NewAddrBind(loopback))
	fns, _, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) != 2 {
		t.Fatalf("%d receive functions, want the socket's and the relay's", len(fns))
	}
	got := receiveAll(fns[1])

	d.SetRelay(a) // installed after the receiver started waiting
	expect(t, got, b, a.RelayedAddr(), "to a")
	d.SetRelay(c)
	expect(t, got, b, c.RelayedAddr(), "to c")

	// Sending goes through the installed relay.
	peer, err := d.ParseEndpoint(wgbind.RelayPrefix + b.RelayedAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Send([][]byte{[]byte("c to b")}, peer); err != nil {
		t.Fatal(err)
	}
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	if n, from, err := b.ReadFrom(buf); err != nil || string(buf[:n]) != "c to b" || from.String() != c.RelayedAddr().String() {
		t.Fatalf("b read %q from %v: %v", buf[:n], from, err)
	}

	// The installed allocation closes without being removed first: the
	// receiver waits for the next one.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	d.SetRelay(a)
	expect(t, got, b, a.RelayedAddr(), "to a again")

	d.SetRelay(nil)
	if err := d.Send([][]byte{[]byte("x")}, peer); !errors.Is(err, wgbind.ErrNoRelay) {
		t.Fatalf("send with the relay removed: %v, want ErrNoRelay", err)
	}
	d.SetRelay(a)

	// Closed and reopened, the bind receives from the relay again.
	got = closeAndReopen(t, d, got)
	expect(t, got, b, a.RelayedAddr(), "after reopening")
	d.SetRelay(nil) // Close must also end a receiver waiting for a relay
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, got)
}

type wgNode struct {
	dev   *device.Device
	net   *netstack.Net
	demux *wgbind.Demux
	ip    netip.Addr
	priv  [32]byte
	pub   [32]byte
}

func newNode(t *testing.T, ip string) *wgNode {
	t.Helper()
	n := &wgNode{ip: netip.MustParseAddr(ip)}
	if _, err := rand.Read(n.priv[:]); err != nil {
		t.Fatal(err)
	}
	n.priv[0] &= 248
	n.priv[31] = n.priv[31]&127 | 64
	pub, err := curve25519.X25519(n.priv[:], curve25519.Basepoint)
	if err != nil {
		t.Fatal(err)
	}
	copy(n.pub[:], pub)
	tunDev, tnet, err := netstack.CreateNetTUN([]netip.Addr{n.ip}, nil, 1420)
	if err != nil {
		t.Fatal(err)
	}
	n.net = tnet
	n.demux = wgbind.NewDemux(wgbind.NewAddrBind(loopback))
	n.dev = device.NewDevice(tunDev, n.demux, device.NewLogger(device.LogLevelError, fmt.Sprintf("(%s) ", ip)))
	t.Cleanup(n.dev.Close)
	if err := n.dev.IpcSet("private_key=" + hex.EncodeToString(n.priv[:]) + "\nlisten_port=0\n"); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *wgNode) addPeer(t *testing.T, peer *wgNode, endpoint string) {
	t.Helper()
	cfg := fmt.Sprintf("public_key=%s\nendpoint=%s\nallowed_ip=%s/32\n", hex.EncodeToString(peer.pub[:]), endpoint, peer.ip)
	if err := n.dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
}

// roundTrip opens a TCP connection from one node to an echo server on the
// other, through the tunnel, and checks the echo.
func roundTrip(t *testing.T, from, to *wgNode, port uint16, msg string) {
	t.Helper()
	ln, err := to.net.ListenTCPAddrPort(netip.AddrPortFrom(to.ip, port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := from.net.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(to.ip, port))
	if err != nil {
		t.Fatalf("dialing %s across the relayed tunnel: %v", to.ip, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %q: %v", buf, err)
	}
}

func endpointOf(t *testing.T, n *wgNode) string {
	t.Helper()
	s, err := n.dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "endpoint="); ok {
			return v
		}
	}
	return ""
}

// Two real WireGuard devices whose only path is a relay: each peer's
// endpoint is the other's relayed address.
func TestWireGuardThroughRelay(t *testing.T) {
	s := relaytest.Start(t, relaySecret)
	allocA, allocB := relaytest.Allocate(t, s, relaySecret, "a"), relaytest.Allocate(t, s, relaySecret, "b")
	a, b := newNode(t, "10.77.0.1"), newNode(t, "10.77.0.2")
	a.demux.SetRelay(allocA)
	b.demux.SetRelay(allocB)
	// The initiation hook (meshd's cue during a peer's key rotation) sees
	// handshakes that arrive through the relay too.
	var initiations atomic.Int64
	b.demux.OnInitiation(func([]byte) func() { initiations.Add(1); return nil })
	a.addPeer(t, b, wgbind.RelayPrefix+allocB.RelayedAddr().String())
	b.addPeer(t, a, wgbind.RelayPrefix+allocA.RelayedAddr().String())
	for _, n := range []*wgNode{a, b} {
		if err := n.dev.Up(); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip(t, a, b, 8080, "hello over the relay")
	if initiations.Load() == 0 {
		t.Fatal("a's handshake initiation through the relay did not reach b's hook")
	}
	roundTrip(t, b, a, 8081, "and back")
	if got, want := endpointOf(t, a), wgbind.RelayPrefix+allocB.RelayedAddr().String(); got != want {
		t.Fatalf("a's peer endpoint %q, want %q", got, want)
	}
	if got, want := endpointOf(t, b), wgbind.RelayPrefix+allocA.RelayedAddr().String(); got != want {
		t.Fatalf("b's peer endpoint %q, want %q", got, want)
	}
	if st := s.Stats(); st.Packets == 0 || st.Allocations != 2 {
		t.Fatalf("relay stats %+v: want traffic between 2 allocations", st)
	}

	// Setting listen_port closes and reopens the bind (as does Down and
	// Up, which also forgets the session and so meets WireGuard's
	// handshake flood guard for 5 s): the relay path comes back with it.
	if err := a.dev.IpcSet("listen_port=0\n"); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, a, b, 8082, "after a rebind")

	// A swap to a fresh allocation: b learns a's new relayed address as a
	// roaming peer once a speaks from it.
	allocA2 := relaytest.Allocate(t, s, relaySecret, "a2")
	a.demux.SetRelay(allocA2)
	roundTrip(t, a, b, 8083, "after a swap")
	if got, want := endpointOf(t, b), wgbind.RelayPrefix+allocA2.RelayedAddr().String(); got != want {
		t.Fatalf("b's peer endpoint %q after the swap, want %q", got, want)
	}

	// Closing the devices returns, relay installed or not.
	b.demux.SetRelay(nil)
	for _, n := range []*wgNode{a, b} {
		closed := make(chan struct{})
		go func() { n.dev.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("device Close hangs")
		}
	}
}

// Any net.PacketConn serves as the relay. A plain socket keeps a past read
// deadline until it is cleared, so this checks that a swap back and a
// reopen clear the deadline that woke the receiver.
func TestRelayReceiverPlainSockets(t *testing.T) {
	listen := func() *net.UDPConn {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	one, two, sender := listen(), listen(), listen()
	d := wgbind.NewDemux(wgbind.NewAddrBind(loopback))
	fns, _, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	got := receiveAll(fns[len(fns)-1])
	expectFrom := func(to *net.UDPConn, payload string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		resend := time.NewTicker(100 * time.Millisecond)
		defer resend.Stop()
		for {
			if _, err := sender.WriteTo([]byte(payload), to.LocalAddr()); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatalf("receiver ended waiting for %q: %v", payload, r.err)
				}
				if r.data == payload {
					if want := wgbind.RelayPrefix + sender.LocalAddr().String(); r.from.DstToString() != want {
						t.Fatalf("%q from %s, want %s", payload, r.from.DstToString(), want)
					}
					return
				}
			case <-resend.C:
			case <-deadline:
				t.Fatalf("%q never arrived", payload)
			}
		}
	}
	d.SetRelay(one)
	expectFrom(one, "one")
	d.SetRelay(two)
	expectFrom(two, "two")
	d.SetRelay(one)
	expectFrom(one, "one again")
	got = closeAndReopen(t, d, got)
	expectFrom(one, "reopened")
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, got)
}
