package node

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

func TestBackoffBounds(t *testing.T) {
	for attempt, base := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: 60 * time.Second, 50: 60 * time.Second} {
		for range 100 {
			d := Backoff(attempt)
			if d < base*3/4 || d > base*5/4 {
				t.Fatalf("attempt %d: %s outside %s ±25%%", attempt, d, base)
			}
		}
	}
}

func key(b byte) Key { var k Key; k[0] = b; return k }

func TestDesiredDropsOfflineAndDiffs(t *testing.T) {
	now := time.Now()
	iv := store.Duration(time.Second)
	peers := map[string]store.MeshPeerRecord{
		"self":  {Machine: "self", PublicKey: key(1).String(), MeshIP: "10.100.0.1"},
		"live":  {Machine: "live", PublicKey: key(2).String(), MeshIP: "10.100.0.2", Endpoints: []string{"192.0.2.2:51820"}},
		"gone":  {Machine: "gone", PublicKey: key(3).String(), MeshIP: "10.100.0.3", Endpoints: []string{"192.0.2.3:51820"}},
		"wg":    {Machine: "wg", PublicKey: key(4).String(), MeshIP: "10.100.0.4", Static: true, Endpoints: []string{"192.0.2.4:51820"}},
		"fresh": {Machine: "fresh", PublicKey: key(5).String(), MeshIP: "10.100.0.5", Endpoints: []string{"192.0.2.5:51820"}},
		"bad":   {Machine: "bad", PublicKey: "nope", MeshIP: "10.100.0.6"},
	}
	beats := map[string]store.MeshHeartbeat{
		"live": {At: now, Interval: iv},
		"gone": {At: now.Add(-11 * time.Second), Interval: iv},
	}
	ds := computeDesired(desiredInputs{self: "self", peers: peers, beats: beats, beatsAt: now, now: now})
	if len(ds.Peers) != 3 || len(ds.Dropped) != 1 || ds.Dropped[0] != "gone" {
		t.Fatalf("desired %v dropped %v", ds.Peers, ds.Dropped)
	}
	// The same stale snapshot read long ago judges as of its read time.
	if ds2 := computeDesired(desiredInputs{self: "self", peers: peers, beats: beats, beatsAt: now.Add(-time.Hour), now: now}); len(ds2.Dropped) != 0 {
		t.Fatalf("judged a stale snapshot against now: %v", ds2.Dropped)
	}
	// Device has "gone" (to remove) and "live" with a wrong allowed IP.
	actual := map[Key]*devPeer{
		key(3): {PublicKey: key(3), AllowedIPs: []string{"10.100.0.3/32"}, Keepalive: PersistentKeepalive},
		key(2): {PublicKey: key(2), AllowedIPs: []string{"10.100.9.9/32"}, Keepalive: PersistentKeepalive},
	}
	if ds.hash() == actualHash(actual) {
		t.Fatal("hashes equal despite drift")
	}
	names := func(k Key) string {
		for m, p := range peers {
			if p.PublicKey == k.String() {
				return m
			}
		}
		return "?"
	}
	p := diff(ds, actual, map[Key]string{key(2): "192.0.2.2:51820"}, names)
	if len(p.added) != 2 || len(p.removed) != 1 || p.removed[0] != "gone" || len(p.updated) != 1 || p.updated[0] != "live" {
		t.Fatalf("plan added=%v removed=%v updated=%v", p.added, p.removed, p.updated)
	}
	// In sync: equal hashes, empty plan.
	synced := map[Key]*devPeer{}
	applied := map[Key]string{}
	for k, d := range ds.Peers {
		synced[k] = &devPeer{PublicKey: k, AllowedIPs: d.AllowedIPs, Keepalive: PersistentKeepalive, Endpoint: "198.51.100.1:9"}
		applied[k] = d.Endpoint
	}
	if ds.hash() != actualHash(synced) {
		t.Fatal("hashes differ for an in-sync device (a roamed endpoint is not drift)")
	}
	if p := diff(ds, synced, applied, names); p.uapi.Len() != 0 {
		t.Fatalf("in-sync plan not empty: %q", p.uapi.String())
	}
}

func TestChooseEndpoint(t *testing.T) {
	rec := store.MeshPeerRecord{Endpoints: []string{"192.168.1.5:51820"}}
	natted := &store.MeshHeartbeat{Endpoint: "203.0.113.9:40000", NATType: NATEndpointIndependent}
	if got := chooseEndpoint(rec, natted, "198.51.100.7:51820"); got != "203.0.113.9:40000" {
		t.Fatalf("behind another NAT: %s", got)
	}
	if got := chooseEndpoint(rec, natted, "203.0.113.9:41000"); got != "192.168.1.5:51820" {
		t.Fatalf("behind the same NAT: %s", got)
	}
	if got := chooseEndpoint(rec, nil, ""); got != "192.168.1.5:51820" {
		t.Fatalf("no heartbeat: %s", got)
	}
	if got := chooseEndpoint(store.MeshPeerRecord{}, natted, ""); got != "203.0.113.9:40000" {
		t.Fatalf("nothing advertised: %s", got)
	}
}

func TestClassifyNAT(t *testing.T) {
	local := map[netip.Addr]bool{netip.MustParseAddr("10.0.0.2"): true}
	ap := netip.MustParseAddrPort
	cases := []struct {
		mapped []netip.AddrPort
		want   string
	}{
		{[]netip.AddrPort{ap("10.0.0.2:51820")}, NATOpen},
		{[]netip.AddrPort{ap("203.0.113.1:4000")}, NATUnclassified},
		{[]netip.AddrPort{ap("203.0.113.1:4000"), ap("203.0.113.1:4000")}, NATEndpointIndependent},
		{[]netip.AddrPort{ap("203.0.113.1:4000"), ap("203.0.113.1:4001")}, NATEndpointDependent},
		{[]netip.AddrPort{ap("10.0.0.2:6000"), ap("10.0.0.2:6000")}, NATEndpointIndependent}, // port rewritten
	}
	for _, c := range cases {
		if got := classify(c.mapped, local, 51820); got != c.want {
			t.Errorf("%v: %s, want %s", c.mapped, got, c.want)
		}
	}
}

func TestParseUAPI(t *testing.T) {
	k := key(7)
	s := "private_key=00\nlisten_port=51820\npublic_key=" + k.Hex() + "\nendpoint=192.0.2.1:51820\n" +
		"last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\nrx_bytes=10\ntx_bytes=20\n" +
		"persistent_keepalive_interval=25\nallowed_ip=10.100.0.9/32\nprotocol_version=1\n"
	m, err := parseUAPI(s)
	if err != nil {
		t.Fatal(err)
	}
	p := m[k]
	if p == nil || p.Endpoint != "192.0.2.1:51820" || p.RxBytes != 10 || p.TxBytes != 20 || p.Keepalive != 25 ||
		len(p.AllowedIPs) != 1 || p.LastHandshake.Unix() != 1700000000 {
		t.Fatalf("parsed %+v", p)
	}
	if _, err := parseUAPI("public_key=zz\n"); err == nil {
		t.Fatal("bad key accepted")
	}
}

// A pair's preshared key is used only when both peer records say their
// nodes use keys (and this node holds the pair's): the two ends agree, or
// a tunnel could not form. A static peer never gets one. The plan sets,
// changes and removes keys on the device.
func TestDesiredPresharedKeys(t *testing.T) {
	now := time.Now()
	iv := store.Duration(time.Second)
	caps := map[string]string{store.MeshCapPSK: "v1"}
	peers := map[string]store.MeshPeerRecord{
		"self": {Machine: "self", PublicKey: key(1).String(), MeshIP: "10.100.0.1", Capabilities: caps},
		"a":    {Machine: "a", PublicKey: key(2).String(), MeshIP: "10.100.0.2", Capabilities: caps},
		"b":    {Machine: "b", PublicKey: key(3).String(), MeshIP: "10.100.0.3"}, // joined before keys
		"wg":   {Machine: "wg", PublicKey: key(4).String(), MeshIP: "10.100.0.4", Static: true, Capabilities: caps},
	}
	beats := map[string]store.MeshHeartbeat{"a": {At: now, Interval: iv}, "b": {At: now, Interval: iv}}
	psks := map[string]Key{"a": key(20), "b": key(30), "wg": key(40)}
	ds := computeDesired(desiredInputs{self: "self", peers: peers, beats: beats, beatsAt: now, now: now, psk: func(m string) Key { return psks[m] }})
	if ds.Peers[key(2)].PSK != key(20) || ds.Peers[key(3)].PSK != (Key{}) || ds.Peers[key(4)].PSK != (Key{}) {
		t.Fatalf("keys: a %v, b %v, wg %v", ds.Peers[key(2)].PSK, ds.Peers[key(3)].PSK, ds.Peers[key(4)].PSK)
	}
	// A node joined before keys uses none, with anyone.
	old := peers["self"]
	old.Capabilities = nil
	peers["self"] = old
	if d := computeDesired(desiredInputs{self: "self", peers: peers, beats: beats, beatsAt: now, now: now, psk: func(m string) Key { return psks[m] }}); d.Peers[key(2)].PSK != (Key{}) {
		t.Fatal("a node without the capability uses a key")
	}
	peers["self"] = store.MeshPeerRecord{Machine: "self", PublicKey: key(1).String(), MeshIP: "10.100.0.1", Capabilities: caps}
	names := func(k Key) string { return k.String() }
	synced := map[Key]*devPeer{}
	applied := map[Key]string{}
	for k, d := range ds.Peers {
		synced[k] = &devPeer{PublicKey: k, AllowedIPs: d.AllowedIPs, Keepalive: PersistentKeepalive}
		applied[k] = d.Endpoint
	}
	// The device lacks a's key and has a stale one for b.
	synced[key(3)].PSK = key(99)
	p := diff(ds, synced, applied, names)
	want := "public_key=" + key(2).Hex() + "\nupdate_only=true\npreshared_key=" + key(20).Hex()
	if !strings.Contains(p.uapi.String(), want) || !strings.Contains(p.uapi.String(), "preshared_key="+(Key{}).Hex()) || len(p.updated) != 2 {
		t.Fatalf("plan %q, updated %v", p.uapi.String(), p.updated)
	}
	synced[key(2)].PSK, synced[key(3)].PSK = key(20), Key{}
	if p := diff(ds, synced, applied, names); p.uapi.Len() != 0 {
		t.Fatalf("in-sync plan not empty: %q", p.uapi.String())
	}
	// The device's own report of a key is read back.
	got, err := parseUAPI("public_key=" + key(2).Hex() + "\npreshared_key=" + key(20).Hex() + "\n")
	if err != nil || got[key(2)].PSK != key(20) {
		t.Fatalf("parsed %+v, %v", got[key(2)], err)
	}
}

// A peer in its key overlap: both keys in the device, the mesh IP on the
// old one until the peer has been heard from under the new one, on the new
// one after; the old key gone when the overlap ends.
func TestDesiredKeyOverlap(t *testing.T) {
	now := time.Now()
	iv := store.Duration(time.Second)
	rotated := store.MeshPeerRecord{Machine: "a", PublicKey: key(3).String(), MeshIP: "10.100.0.2", Endpoints: []string{"192.0.2.2:51820"},
		PreviousKey: key(2).String(), PreviousUntil: now.Add(time.Minute), KeySince: now}
	peers := map[string]store.MeshPeerRecord{"self": {Machine: "self", PublicKey: key(1).String(), MeshIP: "10.100.0.1"}, "a": rotated}
	beats := map[string]store.MeshHeartbeat{"a": {At: now, Interval: iv}}
	in := desiredInputs{self: "self", peers: peers, beats: beats, beatsAt: now, now: now, actual: map[Key]*devPeer{}}
	ds := computeDesired(in)
	oldK, newK := ds.Peers[key(2)], ds.Peers[key(3)]
	if len(ds.Peers) != 2 || !oldK.Previous || len(oldK.AllowedIPs) != 1 || len(newK.AllowedIPs) != 0 ||
		oldK.Endpoint != newK.Endpoint || !ds.Rotating || !ds.Expires.Equal(rotated.PreviousUntil) {
		t.Fatalf("before the new key is heard from: %+v (rotating %v, expires %v)", ds.Peers, ds.Rotating, ds.Expires)
	}
	if len(ds.Awaiting) != 1 || ds.Awaiting[key(3)] != key(2) {
		t.Fatalf("awaiting %v, want the new key replacing the old", ds.Awaiting)
	}
	// An initiation under the new key arrived (awaitSwitch), not counted
	// by WireGuard yet: the address moves.
	in.switched = map[Key]bool{key(3): true}
	ds = computeDesired(in)
	if oldK, newK := ds.Peers[key(2)], ds.Peers[key(3)]; len(oldK.AllowedIPs) != 0 || len(newK.AllowedIPs) != 1 || ds.Rotating || len(ds.Awaiting) != 0 {
		t.Fatalf("after the initiation: %+v (awaiting %v)", ds.Peers, ds.Awaiting)
	}
	in.switched = nil
	// Its handshake initiation counted: the address moves.
	in.actual[key(3)] = &devPeer{PublicKey: key(3), RxBytes: 148}
	ds = computeDesired(in)
	if oldK, newK := ds.Peers[key(2)], ds.Peers[key(3)]; len(oldK.AllowedIPs) != 0 || len(newK.AllowedIPs) != 1 || ds.Rotating {
		t.Fatalf("after: %+v", ds.Peers)
	}
	// Past the overlap only the new key is left.
	in.now = now.Add(2 * time.Minute)
	in.beatsAt = in.now
	beats["a"] = store.MeshHeartbeat{At: in.now, Interval: iv}
	if ds = computeDesired(in); len(ds.Peers) != 1 || len(ds.Peers[key(3)].AllowedIPs) != 1 || !ds.Expires.IsZero() {
		t.Fatalf("after the overlap: %+v", ds.Peers)
	}
	// A rotation asked for after the key was registered is due; one the
	// node already answered is not.
	asked := store.MeshPeerRecord{RegisteredAt: now.Add(-time.Hour), RotateRequested: now}
	if !asked.RotationDue() {
		t.Fatal("a requested rotation is not due")
	}
	asked.KeySince = now.Add(time.Second)
	if asked.RotationDue() {
		t.Fatal("a rotation already done is still due")
	}
}
