package node_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// TestKeyRotationKeepsTunnels: an operator asks alpha to rotate its key
// while a TCP stream runs from alpha to beta. Alpha registers a new key,
// switches to it, beta moves alpha's mesh IP to the new key on the first
// handshake under it, and the stream runs on. Beta accepts a handshake
// under the old key during the overlap and refuses it after.
func TestKeyRotationKeepsTunnels(t *testing.T) {
	c := startCluster(t)
	const overlap = 4 * time.Second
	fast := func(cfg *node.Config) { cfg.KeyOverlap, cfg.RotatePrepare = overlap, 300*time.Millisecond }
	a := c.join(t, "alpha", fast)
	b := c.join(t, "beta", fast)
	ipA, ipB := netip.MustParseAddr(a.State().MeshIP), netip.MustParseAddr(b.State().MeshIP)
	servePong(t, b, ipB)
	storetest.Eventually(t, 15*time.Second, "alpha reaches beta", func() bool { return pongs(context.Background(), a, ipB) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	received, streamErr := stream(t, ctx, a, b, ipB)
	progressed := func(what string, within time.Duration) {
		t.Helper()
		from, start := received.Load(), time.Now()
		// Progress, not throughput: under the race detector on a loaded
		// 2-core machine the userspace stack moves a few hundred KiB/s.
		storetest.Eventually(t, within, "the stream moves "+what, func() bool { return received.Load() > from+128<<10 })
		t.Logf("the stream moved 128 KiB %s in %s", what, time.Since(start).Round(time.Millisecond))
	}
	progressed("before the rotation", 15*time.Second)

	oldKey, err := node.LoadOrCreateKey(a.dir)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registrar.New(c.srv.Store, registrar.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.RequestRotation(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 15*time.Second, "alpha switches to a new key", func() bool { return a.PublicKey() != oldKey.Public() })
	newPub := a.PublicKey().String()
	storetest.Eventually(t, 10*time.Second, "beta shakes hands with alpha's new key", func() bool {
		p, ok := b.peer(t, "alpha")
		return ok && p.PublicKey == newPub && !p.LastHandshake.IsZero()
	})
	progressed("after the switch", 15*time.Second)
	if p, ok := b.peer(t, "alpha"); !ok || p.KeySince.IsZero() {
		t.Fatalf("beta's view of alpha: %+v", p)
	}
	// The data dir holds the new key, the next-key file is gone.
	if k, err := node.LoadOrCreateKey(a.dir); err != nil || k.Public().String() != newPub {
		t.Fatalf("alpha's saved key: %v %v", k.Public(), err)
	}

	psk := pairKey(t, c, "alpha", "beta")
	endpoint := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(b.State().ListenPort))
	rec, err := c.srv.Store.MeshPeer(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if time.Until(rec.PreviousUntil) > time.Second {
		if !handshakes(t, oldKey, b.PublicKey(), psk, endpoint, ipA, ipB) {
			t.Fatal("beta refused alpha's old key during the overlap")
		}
	}
	storetest.Eventually(t, overlap+5*time.Second, "beta drops alpha's old key", func() bool {
		for _, p := range b.status(t).Peers {
			if p.Machine == "alpha" && p.Key == node.KeyPrevious {
				return false
			}
		}
		return true
	})
	if handshakes(t, oldKey, b.PublicKey(), psk, endpoint, ipA, ipB) {
		t.Fatal("beta still accepts alpha's old key after the overlap")
	}
	// The stall once seen here (2026-11-25) began at the switch: the first
	// window under the new key was dropped before beta moved alpha's mesh
	// IP, and the writer's deadline ran out in netstack's slow recovery
	// (see awaitSwitch). The window is the one the other steps have.
	progressed("after the overlap", 15*time.Second)
	cancel()
	if err := <-streamErr; err != nil {
		t.Fatalf("the stream broke: %v", err)
	}
}

// stream writes from a to a sink on b's mesh IP until ctx ends; it counts
// the bytes b received, and reports the writer's first error (nil when ctx
// ended it).
func stream(t *testing.T, ctx context.Context, a, b *runningNode, ipB netip.Addr) (*atomic.Int64, <-chan error) {
	t.Helper()
	ln, err := b.Net().ListenTCPAddrPort(netip.AddrPortFrom(ipB, pongPort+1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var received atomic.Int64
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			received.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := a.Net().DialContextTCPAddrPort(dctx, netip.AddrPortFrom(ipB, pongPort+1))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		defer w.Close()
		chunk := make([]byte, 16<<10)
		for ctx.Err() == nil {
			// A stalled tunnel shows as a missed deadline: TCP itself
			// would wait out minutes of loss.
			_ = w.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := w.Write(chunk); err != nil {
				if ctx.Err() == nil {
					errc <- err
					return
				}
			}
		}
		errc <- nil
	}()
	return &received, errc
}

// pairKey is the preshared key the registrar derives for a and b.
func pairKey(t *testing.T, c *cluster, a, b string) [32]byte {
	t.Helper()
	secret, err := c.srv.Store.MeshPSKSecret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return registrar.PSK(secret, a, b)
}

// handshakes reports whether a WireGuard device holding priv completes a
// handshake with the peer pub at endpoint within a few seconds.
func handshakes(t *testing.T, priv, pub node.Key, psk [32]byte, endpoint netip.AddrPort, self, peerIP netip.Addr) bool {
	t.Helper()
	tn, tnet, err := netstack.CreateNetTUN([]netip.Addr{self}, nil, node.MTU)
	if err != nil {
		t.Fatal(err)
	}
	dev := device.NewDevice(tn, conn.NewStdNetBind(), device.NewLogger(device.LogLevelSilent, ""))
	defer dev.Close()
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=0\npublic_key=%s\npreshared_key=%x\nendpoint=%s\nallowed_ip=%s/32\n",
		priv.Hex(), pub.Hex(), psk, endpoint, peerIP)
	if err := dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
	if err := dev.Up(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if c, err := tnet.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(peerIP, pongPort)); err == nil {
		_, _ = io.ReadAll(c)
		c.Close()
	}
	s, err := dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	return !strings.Contains(s, "last_handshake_time_sec=0\n")
}
