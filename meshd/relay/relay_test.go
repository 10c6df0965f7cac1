package relay_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/relay/relaytest"
	"github.com/edgeplane/edgeplane/store/storetest"
)

var secret = []byte("test secret shared by control and relay")

// deliver sends payload from one allocation to another, resending until it
// arrives (UDP) or the deadline passes.
func deliver(t *testing.T, from, to *relay.Allocation, payload []byte) {
	t.Helper()
	buf := make([]byte, 1500)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := from.WriteTo(payload, net.UDPAddrFromAddrPort(to.RelayedAddr())); err != nil {
			t.Fatalf("sending %q: %v", payload, err)
		}
		to.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			n, src, err := to.ReadFrom(buf)
			if err != nil {
				break // read deadline: send again
			}
			if bytes.Equal(buf[:n], payload) {
				if got := src.(*net.UDPAddr).AddrPort(); got != from.RelayedAddr() {
					t.Fatalf("%q came from %v, want the sender's relayed address %v", payload, got, from.RelayedAddr())
				}
				to.SetReadDeadline(time.Time{})
				return
			}
		}
	}
	t.Fatalf("%q from %v never reached %v", payload, from.RelayedAddr(), to.RelayedAddr())
}

func TestRelayBetweenAllocations(t *testing.T) {
	s := relaytest.Start(t, secret)
	a := relaytest.Allocate(t, s, secret, "box-a")
	b := relaytest.Allocate(t, s, secret, "box-b")
	for _, al := range []*relay.Allocation{a, b} {
		if al.RelayedAddr().Addr() != netip.MustParseAddr("127.0.0.1") || al.RelayedAddr().Port() < relay.DefaultMinPort {
			t.Fatalf("relayed address %v: want 127.0.0.1 in the default port range", al.RelayedAddr())
		}
	}
	if n := s.Stats().Allocations; n != 2 {
		t.Fatalf("allocations %d, want 2", n)
	}
	// b has sent nothing yet: its permission for the relay's address,
	// opened by Allocate, lets a's datagrams in.
	deliver(t, a, b, []byte("a to b"))
	deliver(t, b, a, []byte("b to a"))
	// Once the channel binds are up the data moves as ChannelData.
	for i := range 20 {
		deliver(t, a, b, []byte("a to b #"+strconv.Itoa(i)))
		deliver(t, b, a, []byte("b to a #"+strconv.Itoa(i)))
	}
	// The relay counts a datagram just after sending it on.
	storetest.Eventually(t, 5*time.Second, "the relay to count 42 datagrams", func() bool { return s.Stats().Packets >= 42 })
	if st := s.Stats(); st.Bytes < 42*6 || st.Refused != 0 || st.AuthFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.ReadFrom(make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v, want net.ErrClosed", err)
	}
	storetest.Eventually(t, 5*time.Second, "the relay to drop the closed allocation", func() bool { return s.Stats().Allocations == 1 })
}

func TestCredentials(t *testing.T) {
	before := time.Now()
	user, pass, exp, err := relay.Credentials(secret, "box-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(exp.Unix(), 10) + ":box-a"; user != want {
		t.Fatalf("username %q, want %q", user, want)
	}
	if d := exp.Sub(before); d < time.Hour-time.Second || d > time.Hour+time.Second {
		t.Fatalf("expires in %v, want an hour", d)
	}
	mac := hmac.New(sha1.New, secret)
	mac.Write([]byte(user))
	if want := base64.StdEncoding.EncodeToString(mac.Sum(nil)); pass != want {
		t.Fatalf("password %q, want base64(HMAC-SHA1(secret, username)) %q", pass, want)
	}
	for _, bad := range []struct {
		secret  []byte
		machine string
		ttl     time.Duration
	}{{nil, "m", time.Hour}, {secret, "", time.Hour}, {secret, "m", 0}, {secret, "m", -time.Hour}, {secret, strings.Repeat("m", 600), time.Hour}} {
		if _, _, _, err := relay.Credentials(bad.secret, bad.machine, bad.ttl); err == nil {
			t.Errorf("Credentials(%q, %.10q, %v) succeeded", bad.secret, bad.machine, bad.ttl)
		}
	}
}

func TestBadCredentialsRefused(t *testing.T) {
	s := relaytest.Start(t, secret)
	user, pass, _, err := relay.Credentials(secret, "box-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// An expired username, signed correctly: only the expiry is wrong.
	old := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10) + ":box-a"
	mac := hmac.New(sha1.New, secret)
	mac.Write([]byte(old))
	oldPass := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	_, otherPass, _, err := relay.Credentials([]byte("another secret"), "box-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string][2]string{
		"wrong password": {user, pass + "x"},
		"other secret":   {user, otherPass},
		"expired":        {old, oldPass},
		"no expiry":      {"box-a", pass},
	} {
		t.Run(name, func(t *testing.T) {
			before := s.Stats().AuthFailures
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := relay.Allocate(ctx, relay.ClientConfig{Server: s.Addr().String(), Username: c[0], Password: c[1], Local: "127.0.0.1:0"})
			if err == nil {
				a.Close()
				t.Fatal("allocated")
			}
			if !errors.Is(err, relay.ErrCredentials) || !strings.Contains(err.Error(), s.Addr().String()) {
				t.Fatalf("error %q: want ErrCredentials naming the relay", err)
			}
			if s.Stats().AuthFailures <= before {
				t.Fatalf("auth failures not counted: %+v", s.Stats())
			}
		})
	}
	if n := s.Stats().Allocations; n != 0 {
		t.Fatalf("%d allocations from refused credentials", n)
	}
}

// The relay is no open proxy: an authenticated client reaches neither
// another address nor a port on the relay's address that is no allocation.
func TestRelayRefusesOtherPeers(t *testing.T) {
	s := relaytest.Start(t, secret)
	a := relaytest.Allocate(t, s, secret, "box-a")
	b := relaytest.Allocate(t, s, secret, "box-b")
	listen := func(ip string) *net.UDPConn {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	elsewhere := listen("127.0.0.2") // another address: permission refused
	onRelayIP := listen("127.0.0.1") // the relay's address, but no allocation

	_, err := a.WriteTo([]byte("to elsewhere"), elsewhere.LocalAddr())
	if err == nil {
		t.Fatal("permission to 127.0.0.2 granted")
	}
	t.Logf("refused as it should be: %v", err)
	refused := s.Stats().Refused
	if refused == 0 {
		t.Fatalf("refusal not counted: %+v", s.Stats())
	}
	// The permission for 127.0.0.1 exists (Allocate opened it), so pion
	// forwards these; the relayed socket refuses them by port.
	for i := range 3 {
		if _, err := a.WriteTo([]byte("to a non-relay port"), onRelayIP.LocalAddr()); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	storetest.Eventually(t, 5*time.Second, "the relay to refuse the non-relay port", func() bool { return s.Stats().Refused >= refused+3 })
	// Allocations still reach each other.
	deliver(t, a, b, []byte("still relaying"))
	for _, c := range []*net.UDPConn{elsewhere, onRelayIP} {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, from, err := c.ReadFrom(make([]byte, 1500)); err == nil {
			t.Fatalf("%v received %d bytes from %v through the relay", c.LocalAddr(), n, from)
		}
	}
	storetest.Eventually(t, 5*time.Second, "the relay to count the relayed datagram", func() bool { return s.Stats().Packets > 0 })
}

func TestAllocateHonoursContext(t *testing.T) {
	// A socket that never answers.
	mute, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	user, pass, _, err := relay.Credentials(secret, "box-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = relay.Allocate(ctx, relay.ClientConfig{Server: mute.LocalAddr().String(), Username: user, Password: pass, Local: "127.0.0.1:0"})
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Allocate took %v past a 500ms context", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), mute.LocalAddr().String()) {
		t.Fatalf("error %v: want the deadline, naming the relay", err)
	}
}

func TestServerConfig(t *testing.T) {
	for name, cfg := range map[string]relay.ServerConfig{
		"wildcard without relay ip": {Listen: "0.0.0.0:0", Secret: secret},
		"no secret":                 {Listen: "127.0.0.1:0"},
		"ipv6 relay ip":             {Listen: "0.0.0.0:0", Secret: secret, RelayIP: netip.MustParseAddr("2001:db8::1")},
		"empty port range":          {Listen: "127.0.0.1:0", Secret: secret, MinPort: 60000, MaxPort: 50000},
	} {
		if s, err := relay.Listen(context.Background(), cfg); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	s, err := relay.Listen(context.Background(), relay.ServerConfig{Listen: "0.0.0.0:0", Secret: secret, RelayIP: netip.MustParseAddr("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.RelayIP() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("relay ip %v", s.RelayIP())
	}
}

// The server stops with its context; relay and allocations leave no
// goroutine behind once closed.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := relay.Listen(ctx, relay.ServerConfig{Listen: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	var allocs []*relay.Allocation
	for i := range 2 {
		user, pass, _, err := relay.Credentials(secret, fmt.Sprintf("box-%d", i), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		a, err := relay.Allocate(context.Background(), relay.ClientConfig{Server: s.Addr().String(), Username: user, Password: pass, Local: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		allocs = append(allocs, a)
	}
	deliver(t, allocs[0], allocs[1], []byte("hello"))
	deliver(t, allocs[1], allocs[0], []byte("hello back"))
	for _, a := range allocs {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	storetest.Eventually(t, 5*time.Second, "the relay to drop both allocations", func() bool { return s.Stats().Allocations == 0 })
	cancel()
	storetest.Eventually(t, 5*time.Second, "goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}
