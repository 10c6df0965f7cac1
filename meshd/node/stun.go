package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/pion/stun/v3"

	"github.com/edgeplane/edgeplane/meshd/wgbind"
)

// NAT classifications (RFC 4787 mapping behaviour, as far as binding
// requests to one or two servers can tell).
const (
	NATOpen                = "open"                 // mapped address is our own: no NAT
	NATEndpointIndependent = "endpoint_independent" // same mapping towards every server ("cone")
	NATEndpointDependent   = "endpoint_dependent"   // a mapping per destination ("symmetric")
	NATUnclassified        = "nat"                  // behind a NAT, one server: mapping kind unknown
	NATUnknown             = "unknown"              // no STUN answer
)

// stunClient sends binding requests from the WireGuard socket and matches
// the answers the demux hands it.
type stunClient struct {
	demux   *wgbind.Demux
	mu      sync.Mutex
	pending map[[stun.TransactionIDSize]byte]chan netip.AddrPort
}

func newSTUNClient(d *wgbind.Demux) *stunClient {
	c := &stunClient{demux: d, pending: make(map[[stun.TransactionIDSize]byte]chan netip.AddrPort)}
	d.SetHandler(c.handle)
	return c
}

func (c *stunClient) handle(pkt []byte, from netip.AddrPort) {
	m := &stun.Message{Raw: append([]byte(nil), pkt...)}
	if err := m.Decode(); err != nil {
		return
	}
	if m.Type == stun.BindingRequest {
		c.answerProbe(m, from)
		return
	}
	if m.Type != stun.BindingSuccess {
		return
	}
	var xa stun.XORMappedAddress
	if err := xa.GetFrom(m); err != nil {
		return
	}
	a, ok := netip.AddrFromSlice(xa.IP)
	if !ok {
		return
	}
	c.mu.Lock()
	ch := c.pending[m.TransactionID]
	delete(c.pending, m.TransactionID)
	c.mu.Unlock()
	if ch != nil {
		ch <- netip.AddrPortFrom(a.Unmap(), uint16(xa.Port))
	}
}

// query asks server for our mapped address, retrying a lost packet.
func (c *stunClient) query(ctx context.Context, server netip.AddrPort) (netip.AddrPort, error) {
	for attempt := 0; attempt < 3; attempt++ {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.Fingerprint)
		if err != nil {
			return netip.AddrPort{}, err
		}
		ch := make(chan netip.AddrPort, 1)
		c.mu.Lock()
		c.pending[m.TransactionID] = ch
		c.mu.Unlock()
		if err := c.demux.SendTo(m.Raw, server); err != nil {
			c.forget(m.TransactionID)
			return netip.AddrPort{}, fmt.Errorf("sending stun request to %s: %w", server, err)
		}
		t := time.NewTimer(time.Duration(500*(attempt+1)) * time.Millisecond)
		select {
		case a := <-ch:
			t.Stop()
			return a, nil
		case <-ctx.Done():
			t.Stop()
			c.forget(m.TransactionID)
			return netip.AddrPort{}, ctx.Err()
		case <-t.C:
			c.forget(m.TransactionID)
		}
	}
	return netip.AddrPort{}, fmt.Errorf("no stun answer from %s", server)
}

func (c *stunClient) forget(id [stun.TransactionIDSize]byte) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// natResult is one discovery.
type natResult struct {
	Endpoint string    `json:"endpoint,omitempty"`
	Type     string    `json:"type"`
	At       time.Time `json:"at"`
	Error    string    `json:"error,omitempty"`
}

// discover queries every server and classifies the NAT.
func (c *stunClient) discover(ctx context.Context, servers []string, listenPort int) natResult {
	res := natResult{Type: NATUnknown, At: time.Now().UTC()}
	var mapped []netip.AddrPort
	var errs []error
	for _, s := range servers {
		ap, err := resolveAddrPort(ctx, s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m, err := c.query(ctx, ap)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		mapped = append(mapped, m)
	}
	if len(mapped) == 0 {
		if len(errs) > 0 {
			res.Error = errors.Join(errs...).Error()
		} else {
			res.Error = "no stun servers configured"
		}
		return res
	}
	res.Endpoint = mapped[0].String()
	res.Type = classify(mapped, localAddrs(), listenPort)
	return res
}

func classify(mapped []netip.AddrPort, local map[netip.Addr]bool, listenPort int) string {
	if local[mapped[0].Addr()] && int(mapped[0].Port()) == listenPort {
		return NATOpen
	}
	if len(mapped) < 2 {
		return NATUnclassified
	}
	for _, m := range mapped[1:] {
		if m != mapped[0] {
			return NATEndpointDependent
		}
	}
	return NATEndpointIndependent
}

func resolveAddrPort(ctx context.Context, s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("stun server %q: %w", s, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("resolving stun server %q: %v", s, err)
	}
	ua, err := net.ResolveUDPAddr("udp", net.JoinHostPort(ips[0].String(), port))
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ua.AddrPort(), nil
}

func localAddrs() map[netip.Addr]bool {
	out := make(map[netip.Addr]bool)
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out
}
