package node

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// desiredPeer is one peer the device should have.
type desiredPeer struct {
	Machine    string
	PublicKey  Key
	AllowedIPs []string
	Endpoint   string
	// PSK is the pair's preshared key; zero: none.
	PSK Key
	// Previous marks the key a peer rotated away from, accepted for the
	// overlap.
	Previous bool
}

// desiredSet is the active peer config computed from peer records and
// heartbeats, plus the peers left out because they are offline.
type desiredSet struct {
	Peers   map[Key]desiredPeer
	Dropped []string
	// Rotating: a peer's new key has not shaken hands yet, so its mesh IP
	// is still on the old one (reconcile soon to move it).
	Rotating bool
	// Awaiting holds those new keys, each with the key it replaces: a
	// handshake initiation under one moves the mesh IP before WireGuard
	// answers it (see awaitSwitch).
	Awaiting map[Key]Key
	// Expires is the earliest end of a peer's key overlap (zero: none),
	// when the old key must go.
	Expires time.Time
}

// desiredInputs is what the active config is computed from.
type desiredInputs struct {
	self  string
	peers map[string]store.MeshPeerRecord
	beats map[string]store.MeshHeartbeat
	// beatsAt is when the heartbeats were read.
	beatsAt     time.Time
	myReflexive string
	psk         func(machine string) Key
	// actual is the device as it is: a rotating peer's mesh IP moves to
	// its new key once the device has shaken hands under it, or once
	// switched holds the key (an initiation under it arrived, which
	// WireGuard may not have counted yet).
	actual   map[Key]*devPeer
	switched map[Key]bool
	now      time.Time
	// endpoint, when set, picks the endpoint for machine given the direct
	// one chooseEndpoint found (the relay, or a probed candidate).
	endpoint func(machine, direct string) string
}

// computeDesired derives the active config. Liveness is judged as of when
// the heartbeats were read (beatsAt): a stale snapshot gives old but
// consistent verdicts instead of declaring everyone offline while the
// control plane is away.
func computeDesired(in desiredInputs) desiredSet {
	ds := desiredSet{Peers: make(map[Key]desiredPeer)}
	for machine, rec := range in.peers {
		if machine == in.self {
			continue
		}
		key, err := ParseKey(rec.PublicKey)
		if err != nil {
			continue
		}
		ip, err := netip.ParseAddr(rec.MeshIP)
		if err != nil {
			continue
		}
		var hb *store.MeshHeartbeat
		if b, ok := in.beats[machine]; ok {
			hb = &b
		}
		if !rec.Static && hb != nil && hb.Liveness(in.beatsAt) == store.LivenessOffline {
			ds.Dropped = append(ds.Dropped, machine)
			continue
		}
		d := desiredPeer{
			Machine: machine, PublicKey: key,
			AllowedIPs: []string{netip.PrefixFrom(ip, ip.BitLen()).String()},
			Endpoint:   chooseEndpoint(rec, hb, in.myReflexive),
		}
		if in.endpoint != nil && !rec.Static {
			d.Endpoint = in.endpoint(machine, d.Endpoint)
		}
		// Both ends of a pair use its key, or neither: both records say
		// the nodes use keys (a node joined before them does not).
		if in.psk != nil && usesPSK(in.peers[in.self]) && usesPSK(rec) {
			d.PSK = in.psk(machine)
		}
		ds.Peers[key] = d
		// A peer in its key overlap has both keys in the device. WireGuard
		// routes an address to one peer only, so the mesh IP stays with
		// the old key until the peer has used the new one, then moves.
		prev, err := ParseKey(rec.PreviousKey)
		if err != nil || prev == key || !rec.PreviousValid(in.now) {
			continue
		}
		old := d
		old.PublicKey, old.Previous = prev, true
		if a := in.actual[key]; (a == nil || !a.heardFrom()) && !in.switched[key] {
			old.AllowedIPs, d.AllowedIPs = d.AllowedIPs, nil
			ds.Peers[key] = d
			if ds.Awaiting == nil {
				ds.Awaiting = make(map[Key]Key)
			}
			ds.Awaiting[key] = prev
			if in.now.Before(rec.KeyAge().Add(rotateFastWindow)) {
				ds.Rotating = true
			}
		} else {
			old.AllowedIPs = nil
		}
		ds.Peers[prev] = old
		if ds.Expires.IsZero() || rec.PreviousUntil.Before(ds.Expires) {
			ds.Expires = rec.PreviousUntil
		}
	}
	sort.Strings(ds.Dropped)
	return ds
}

func usesPSK(rec store.MeshPeerRecord) bool {
	return !rec.Static && rec.Capabilities[store.MeshCapPSK] != ""
}

// chooseEndpoint picks the address to reach a peer at: the STUN-discovered
// one when the peer sits behind a NAT we are not behind too, else the first
// address it advertised.
func chooseEndpoint(rec store.MeshPeerRecord, hb *store.MeshHeartbeat, myReflexive string) string {
	adv := ""
	if len(rec.Endpoints) > 0 {
		adv = rec.Endpoints[0]
	}
	if hb == nil || hb.Endpoint == "" {
		return adv
	}
	if adv == "" {
		return hb.Endpoint
	}
	if hb.NATType == NATOpen {
		return adv
	}
	theirs, err1 := netip.ParseAddrPort(hb.Endpoint)
	mine, err2 := netip.ParseAddrPort(myReflexive)
	if err1 == nil && err2 == nil && theirs.Addr() == mine.Addr() {
		// Same public address: same NAT, use the private path.
		return adv
	}
	return hb.Endpoint
}

// hashPeers is the drift hash a node reports: SHA-256 over the sorted
// peers' keys, allowed IPs and keepalive. Endpoints are left out on
// purpose: WireGuard roams them legitimately.
func hashPeers(lines []string) string {
	sort.Strings(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func peerLine(k Key, allowed []string, keepalive int) string {
	a := append([]string(nil), allowed...)
	sort.Strings(a)
	return fmt.Sprintf("%s %s %d", k.String(), strings.Join(a, ","), keepalive)
}

func (ds desiredSet) hash() string {
	lines := make([]string, 0, len(ds.Peers))
	for k, p := range ds.Peers {
		lines = append(lines, peerLine(k, p.AllowedIPs, PersistentKeepalive))
	}
	return hashPeers(lines)
}

func actualHash(actual map[Key]*devPeer) string {
	lines := make([]string, 0, len(actual))
	for k, p := range actual {
		lines = append(lines, peerLine(k, p.AllowedIPs, p.Keepalive))
	}
	return hashPeers(lines)
}

// plan is the UAPI text that moves the device from actual to desired, and
// what it changes.
type plan struct {
	uapi             strings.Builder
	added, removed   []string
	updated          []string
	endpointsChanged int
}

// diff plans the corrections. applied holds the endpoint meshd last set per
// peer: an endpoint is only re-set when the desired one changed, so a peer
// WireGuard roamed to a new address is not yanked back.
func diff(ds desiredSet, actual map[Key]*devPeer, applied map[Key]string, names func(Key) string) *plan {
	p := &plan{}
	for k := range actual {
		if _, ok := ds.Peers[k]; !ok {
			fmt.Fprintf(&p.uapi, "public_key=%s\nremove=true\n", k.Hex())
			p.removed = append(p.removed, names(k))
		}
	}
	for k, d := range ds.Peers {
		a, have := actual[k]
		setEP := d.Endpoint != "" && (!have || applied[k] != d.Endpoint)
		sameCfg := have && strings.Join(a.AllowedIPs, ",") == strings.Join(sortedCopy(d.AllowedIPs), ",") &&
			a.Keepalive == PersistentKeepalive
		setPSK := (!have && d.PSK != Key{}) || (have && a.PSK != d.PSK)
		if sameCfg && !setEP && !setPSK {
			continue
		}
		fmt.Fprintf(&p.uapi, "public_key=%s\n", k.Hex())
		if have {
			p.uapi.WriteString("update_only=true\n")
		}
		if setPSK {
			// A zero key removes it. The change takes effect at the next
			// handshake; the session in use runs on until then.
			fmt.Fprintf(&p.uapi, "preshared_key=%s\n", d.PSK.Hex())
			if have && sameCfg {
				p.updated = append(p.updated, d.Machine)
			}
		}
		if setEP {
			fmt.Fprintf(&p.uapi, "endpoint=%s\n", d.Endpoint)
			p.endpointsChanged++
		}
		if !sameCfg {
			p.uapi.WriteString("replace_allowed_ips=true\n")
			for _, ip := range d.AllowedIPs {
				fmt.Fprintf(&p.uapi, "allowed_ip=%s\n", ip)
			}
			fmt.Fprintf(&p.uapi, "persistent_keepalive_interval=%d\n", PersistentKeepalive)
			if have {
				p.updated = append(p.updated, d.Machine)
			} else {
				p.added = append(p.added, d.Machine)
			}
		}
	}
	sort.Strings(p.added)
	sort.Strings(p.removed)
	sort.Strings(p.updated)
	return p
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}
