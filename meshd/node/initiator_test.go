package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"
)

// TestInitiatorNamesTheSender: a real wireguard-go initiation is placed on
// the key that sent it, only by the device it was sealed to, and only among
// the candidates; a tampered one is placed on no one.
func TestInitiatorNamesTheSender(t *testing.T) {
	mustKey := func() Key {
		k, err := newKey()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	sender, receiver, other := mustKey(), mustKey(), mustKey()
	pkt := captureInitiation(t, sender, receiver.Public())

	if from, ok := initiator(pkt, receiver, map[Key]Key{sender.Public(): {}, other.Public(): {}}); !ok || from != sender.Public() {
		t.Fatalf("initiator = %v %v, want the sender", from, ok)
	}
	if _, ok := initiator(pkt, receiver, map[Key]Key{other.Public(): {}}); ok {
		t.Fatal("placed on a key that is not a candidate")
	}
	if _, ok := initiator(pkt, other, map[Key]Key{sender.Public(): {}}); ok {
		t.Fatal("opened by a device it was not sealed to")
	}
	bad := append([]byte(nil), pkt...)
	bad[100] ^= 1 // in the sealed timestamp: the sender's key is not proven
	if _, ok := initiator(bad, receiver, map[Key]Key{sender.Public(): {}}); ok {
		t.Fatal("a tampered initiation was placed")
	}
	if _, ok := initiator(pkt[:100], receiver, map[Key]Key{sender.Public(): {}}); ok {
		t.Fatal("a short packet was placed")
	}
}

// captureInitiation has a wireguard-go device holding priv send a handshake
// initiation to peer, and returns it as it came off the wire.
func captureInitiation(t *testing.T, priv, peer Key) []byte {
	t.Helper()
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	self, peerIP := netip.MustParseAddr("10.100.0.1"), netip.MustParseAddr("10.100.0.2")
	tn, tnet, err := netstack.CreateNetTUN([]netip.Addr{self}, nil, MTU)
	if err != nil {
		t.Fatal(err)
	}
	dev := device.NewDevice(tn, conn.NewStdNetBind(), device.NewLogger(device.LogLevelSilent, ""))
	defer dev.Close()
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=0\npublic_key=%s\nendpoint=%s\nallowed_ip=%s/32\n",
		priv.Hex(), peer.Hex(), sink.LocalAddr(), peerIP)
	if err := dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
	if err := dev.Up(); err != nil {
		t.Fatal(err)
	}
	// A packet for the peer makes the device shake hands first.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	dialed := make(chan struct{})
	defer func() { cancel(); <-dialed }()
	go func() {
		defer close(dialed)
		if c, err := tnet.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(peerIP, 9)); err == nil {
			c.Close()
		}
	}()
	_ = sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for {
		n, _, err := sink.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("no initiation: %v", err)
		}
		if n == device.MessageInitiationSize && buf[0] == device.MessageInitiationType {
			return buf[:n]
		}
	}
}
