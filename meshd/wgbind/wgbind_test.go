package wgbind_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pion/stun/v3"
	"golang.zx2c4.com/wireguard/conn"

	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/meshd/wgbind"
)

func TestIsSTUN(t *testing.T) {
	req := stun.MustBuild(stun.TransactionID, stun.BindingRequest)
	resp := stun.MustBuild(stun.TransactionID, stun.BindingSuccess, &stun.XORMappedAddress{IP: net.IPv4(1, 2, 3, 4), Port: 5})
	if !wgbind.IsSTUN(req.Raw) || !wgbind.IsSTUN(resp.Raw) {
		t.Fatal("STUN binding messages not recognised")
	}
	// WireGuard messages: type 1..4, three zero bytes; even one whose
	// receiver index happens to equal the magic cookie is not STUN.
	for typ := byte(1); typ <= 4; typ++ {
		pkt := make([]byte, 148)
		pkt[0] = typ
		copy(pkt[4:8], []byte{0x21, 0x12, 0xA4, 0x42})
		if wgbind.IsSTUN(pkt) {
			t.Fatalf("WireGuard type %d taken for STUN", typ)
		}
	}
	if wgbind.IsSTUN(req.Raw[:19]) || wgbind.IsSTUN(nil) {
		t.Fatal("short packet taken for STUN")
	}
}

func FuzzIsSTUN(f *testing.F) {
	f.Add(stun.MustBuild(stun.TransactionID, stun.BindingRequest).Raw)
	f.Add(make([]byte, 32))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 && b[0] >= 1 && b[0] <= 4 && b[1] == 0 && b[2] == 0 && b[3] == 0 && wgbind.IsSTUN(b) {
			t.Fatalf("WireGuard-shaped packet %x taken for STUN", b)
		}
	})
}

// The demux hands STUN answers arriving on the WireGuard socket to the
// handler and zeroes them for WireGuard, while other packets pass through.
func TestDemuxSharesSocket(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := stunserver.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	d := wgbind.NewDemux(wgbind.NewAddrBind(netip.MustParseAddr("127.0.0.1")))
	got := make(chan netip.AddrPort, 1)
	d.SetHandler(func(pkt []byte, from netip.AddrPort) {
		m := &stun.Message{Raw: append([]byte(nil), pkt...)}
		var xa stun.XORMappedAddress
		if m.Decode() == nil && xa.GetFrom(m) == nil {
			a, _ := netip.AddrFromSlice(xa.IP)
			got <- netip.AddrPortFrom(a.Unmap(), uint16(xa.Port))
		}
	})
	fns, port, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// A non-STUN packet from a plain socket must reach "WireGuard".
	other, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	wgPkt := []byte{4, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	req := stun.MustBuild(stun.TransactionID, stun.BindingRequest)
	if err := d.SendTo(req.Raw, srv.Addr().AddrPort()); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Write(wgPkt); err != nil {
		t.Fatal(err)
	}
	bufs := make([][]byte, conn.IdealBatchSize)
	for i := range bufs {
		bufs[i] = make([]byte, 1500)
	}
	sizes := make([]int, len(bufs))
	eps := make([]conn.Endpoint, len(bufs))
	sawWG := false
	deadline := time.Now().Add(5 * time.Second)
	var mapped netip.AddrPort
	for (!sawWG || !mapped.IsValid()) && time.Now().Before(deadline) {
		n, err := fns[0](bufs, sizes, eps)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if sizes[i] == len(wgPkt) && bufs[i][0] == 4 {
				sawWG = true
			} else if sizes[i] != 0 {
				t.Fatalf("unexpected packet of %d bytes reached WireGuard", sizes[i])
			}
		}
		select {
		case mapped = <-got:
		default:
		}
	}
	if !sawWG {
		t.Fatal("WireGuard packet lost")
	}
	if want := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port); mapped != want {
		t.Fatalf("mapped %v, want the WireGuard socket %v", mapped, want)
	}
	if d.STUNPackets.Load() != 1 {
		t.Fatalf("stun packets %d", d.STUNPackets.Load())
	}
}

// A relay probe never passes for a WireGuard message, nor the reverse.
func TestRelayProbeIsNotWireGuard(t *testing.T) {
	p := wgbind.RelayProbe([]byte("12345678"))
	if !wgbind.IsRelayProbe(p) {
		t.Fatal("a probe is not recognised")
	}
	for typ := byte(1); typ <= 4; typ++ {
		msg := make([]byte, 148)
		msg[0] = typ
		if wgbind.IsRelayProbe(msg) {
			t.Fatalf("a WireGuard message of type %d taken for a probe", typ)
		}
	}
	if wgbind.IsRelayProbe(p[:3]) {
		t.Fatal("a truncated probe recognised")
	}
}
