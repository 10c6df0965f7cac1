package node

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pion/stun/v3"
	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/device"

	"github.com/edgeplane/edgeplane/meshd/wgbind"
)

// Paths. A peer is reached directly first. When no handshake completes over
// the direct path for RelayAfter (both ends behind NATs that map every flow
// anew, a firewall dropping UDP between them), the node sends through its
// allocation on the mesh relay instead, to the peer's relayed address. It
// keeps probing the direct candidates every ProbeInterval with a STUN
// binding request from the WireGuard socket, which the peer's meshd answers
// on its own; the first candidate that answers takes the tunnel back.
//
// WireGuard itself follows the peer: it sends to wherever the last
// authenticated packet came from. So one end moving the tunnel moves the
// other, and what status reports is the device's endpoint, not the choice.

// Defaults of path selection.
const (
	DefaultRelayAfter    = 15 * time.Second
	DefaultProbeInterval = 30 * time.Second
	// sessionStale is how long a session may go without a handshake
	// before the path counts as broken: WireGuard renews a session in use
	// every 2 minutes (REKEY_AFTER_TIME) and gives up on it after 3.
	sessionStale = 135 * time.Second
)

// Path names, in status and metrics.
const (
	PathDirect  = "direct"
	PathRelayed = "relayed"
)

// pathChoice is the node's choice for one peer.
type pathChoice struct {
	relayed bool
	// direct is the candidate that answered the last successful probe;
	// "" until one did (the endpoint from the peer's record is used).
	direct string
	// heard is when the peer was last heard from (its rx bytes grew, or
	// the choice was made), rx its rx bytes then (based: rx is set).
	heard time.Time
	rx    uint64
	based bool
}

// choose records a new choice.
func (c *pathChoice) choose(relayed bool, now time.Time) {
	c.relayed, c.heard, c.based = relayed, now, false
}

// keepaliveWindow is how long a peer with a session may stay silent before
// its path counts as broken: it sends at least a keepalive every
// PersistentKeepalive seconds.
const keepaliveWindow = (PersistentKeepalive + 10) * time.Second

// pathSeen is the path the device used for a peer, as last observed.
type pathSeen struct {
	path  string
	since time.Time
}

// choosePaths moves to the relay the peers not heard from over their direct
// path for too long: RelayAfter for a peer with no session (it never
// answered a handshake), keepaliveWindow for one whose session went quiet.
// n.mu is held. It returns the peers whose endpoint must be set again even
// if it looks applied.
func (n *Node) choosePaths(actual map[Key]*devPeer, now time.Time) map[string]bool {
	force := map[string]bool{}
	for machine, rec := range n.peers {
		if machine == n.st.Machine || rec.Static {
			continue
		}
		c := n.paths[machine]
		if c == nil {
			c = &pathChoice{}
			c.choose(false, now)
			n.paths[machine] = c
		}
		k, err := ParseKey(rec.PublicKey)
		if err != nil {
			continue
		}
		a := actual[k]
		if a == nil {
			continue
		}
		if !c.based || a.RxBytes != c.rx {
			if c.based {
				c.heard = now
			}
			c.rx, c.based = a.RxBytes, true
		}
		if c.relayed || n.relayEndpointOf(machine) == "" {
			continue
		}
		window := n.cfg.RelayAfter
		if !a.LastHandshake.IsZero() && now.Sub(a.LastHandshake) < sessionStale {
			window = max(window, keepaliveWindow)
		}
		if now.Sub(c.heard) < window {
			continue
		}
		c.choose(true, now)
		force[machine] = true
		n.log.Info("peer not heard from over the direct path; sending through the relay", zap.String("peer", machine),
			zap.Duration("after", window), zap.String("relay", n.relayEndpointOf(machine)))
	}
	for machine := range n.paths {
		if _, ok := n.peers[machine]; !ok {
			delete(n.paths, machine)
		}
	}
	return force
}

// relayEndpointOf is the UAPI endpoint of machine's relayed address when
// both nodes hold an allocation on the same relay; "" otherwise. n.mu is
// held.
func (n *Node) relayEndpointOf(machine string) string {
	hb, ok := n.beats[machine]
	if !ok || hb.Relay == "" || !n.relay.addr.IsValid() {
		return ""
	}
	theirs, err := netip.ParseAddrPort(hb.Relay)
	// A relay relays only between its own allocations, all on its one
	// address.
	if err != nil || theirs.Addr() != n.relay.addr.Addr() {
		return ""
	}
	return wgbind.RelayPrefix + theirs.String()
}

// endpointFor is the endpoint computeDesired gives machine; n.mu is held.
func (n *Node) endpointFor(machine, direct string) string {
	c := n.paths[machine]
	if c == nil {
		return direct
	}
	if c.relayed {
		if ep := n.relayEndpointOf(machine); ep != "" {
			return ep
		}
		return direct
	}
	if c.direct != "" {
		return c.direct
	}
	return direct
}

// observePaths records which path the device uses for each peer; n.mu is
// held.
func (n *Node) observePaths(actual map[Key]*devPeer, now time.Time) {
	for k, a := range actual {
		p := PathDirect
		if wgbind.IsRelayed(a.Endpoint) {
			p = PathRelayed
		}
		if s, ok := n.seen[k]; !ok || s.path != p {
			n.seen[k] = pathSeen{path: p, since: now}
			if ok {
				n.log.Info("peer path changed", zap.String("peer", n.names[k]), zap.String("path", p), zap.String("endpoint", a.Endpoint))
			}
		}
	}
	for k := range n.seen {
		if _, ok := actual[k]; !ok {
			delete(n.seen, k)
		}
	}
}

// keepaliveNow sends each peer in keys a keepalive, so a changed endpoint
// is used, and taught to the peer (WireGuard follows the source of
// authenticated packets), at once. A peer without a session gets a
// handshake instead.
func (n *Node) keepaliveNow(keys []Key) {
	for _, k := range keys {
		if p := n.dev.dev.LookupPeer(device.NoisePublicKey(k)); p != nil {
			p.SendKeepalive()
		}
	}
}

// probeLoop probes the direct candidates of every peer the device reaches
// through the relay, every ProbeInterval. A round probes every candidate of
// every peer at once and ends within the interval, so a path that opens is
// found by the next round.
func (n *Node) probeLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, n.cfg.ProbeInterval*3/4)
		var wg sync.WaitGroup
		for machine, cands := range n.probeTargets() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if cand, ok := n.probe(pctx, cands); ok {
					n.takeDirect(machine, cand)
				}
			}()
		}
		wg.Wait()
		cancel()
	}
}

// probe sends a binding request to every candidate at once and returns
// the first that answers.
func (n *Node) probe(ctx context.Context, cands []netip.AddrPort) (netip.AddrPort, bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answered := make(chan netip.AddrPort, len(cands))
	for _, cand := range cands {
		go func() {
			if _, err := n.stun.query(ctx, cand); err == nil {
				answered <- cand
			}
		}()
	}
	select {
	case cand := <-answered:
		return cand, true
	case <-ctx.Done():
		return netip.AddrPort{}, false
	}
}

// takeDirect moves the tunnel to machine onto cand, which answered a probe.
func (n *Node) takeDirect(machine string, cand netip.AddrPort) {
	n.mu.Lock()
	if c := n.paths[machine]; c != nil {
		c.choose(false, time.Now())
		c.direct = cand.String()
		n.forceEndpoint[machine] = true
	}
	n.mu.Unlock()
	n.met.directProbes.WithLabelValues("answered").Inc()
	n.log.Info("direct path answers; moving the tunnel back", zap.String("peer", machine), zap.Stringer("endpoint", cand))
	n.requestApply()
}

// probeTargets lists, per peer the device reaches through the relay, the
// direct candidates to probe: the addresses its record advertises and the
// one STUN found for it.
func (n *Node) probeTargets() map[string][]netip.AddrPort {
	actual, err := n.dev.peers()
	if err != nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string][]netip.AddrPort{}
	for machine, rec := range n.peers {
		if machine == n.st.Machine || rec.Static {
			continue
		}
		k, err := ParseKey(rec.PublicKey)
		if err != nil {
			continue
		}
		a := actual[k]
		if a == nil || !wgbind.IsRelayed(a.Endpoint) {
			continue
		}
		var cands []netip.AddrPort
		add := func(s string) {
			if ap, err := netip.ParseAddrPort(s); err == nil && !slices.Contains(cands, ap) {
				cands = append(cands, ap)
			}
		}
		for _, e := range rec.Endpoints {
			add(e)
		}
		if hb, ok := n.beats[machine]; ok {
			add(hb.Endpoint)
		}
		if len(cands) > 0 {
			out[machine] = cands
			n.met.directProbes.WithLabelValues("sent").Add(float64(len(cands)))
		}
	}
	return out
}

// answerProbe answers a peer's direct-path probe (a STUN binding request
// on the WireGuard socket) with the address it came from, as a STUN server
// would.
func (c *stunClient) answerProbe(req *stun.Message, from netip.AddrPort) {
	resp, err := stun.Build(stun.NewTransactionIDSetter(req.TransactionID), stun.BindingSuccess,
		&stun.XORMappedAddress{IP: from.Addr().AsSlice(), Port: int(from.Port())}, stun.Fingerprint)
	if err != nil {
		return
	}
	_ = c.demux.SendTo(resp.Raw, from)
}

// peerPath is the path the device uses for k and since when; n.mu is
// held.
func (n *Node) peerPath(k Key) (string, time.Time) {
	s, ok := n.seen[k]
	if !ok {
		return "", time.Time{}
	}
	return s.path, s.since
}
