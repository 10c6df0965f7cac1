package store

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Mesh wire records. The registrar (in `control server`) writes peer records
// and IP allocations; each meshd writes only its own heartbeat and drift
// report, which are observations: readers compute liveness from them, nobody
// stores a "node is offline" verdict.

// MeshSubnet is the mesh address range every node gets its /32 from.
const MeshSubnet = "10.100.0.0/16"

// MeshPeerRecord is a node's membership in the mesh: its WireGuard public key,
// mesh IP and advertised endpoints. Key: MeshPeerKey(machine).
type MeshPeerRecord struct {
	Version   int    `json:"version"`
	Machine   string `json:"machine"`
	PublicKey string `json:"public_key"` // base64, as `wg` prints it
	MeshIP    string `json:"mesh_ip"`    // e.g. 10.100.0.7
	// Endpoints are the ip:port addresses the node advertised when it
	// registered (its bound or interface addresses and WireGuard port).
	Endpoints []string `json:"endpoints,omitempty"`
	// Capabilities describe the node (mode, version, features).
	Capabilities map[string]string `json:"capabilities,omitempty"`
	Region       string            `json:"region,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// Static marks a peer that is not ours (a plain WireGuard peer an
	// operator added); it sends no heartbeats, so liveness never drops it.
	Static       bool      `json:"static,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`
	// KeySince is when PublicKey was registered (zero on records written
	// before rotation: RegisteredAt stands in).
	KeySince time.Time `json:"key_since,omitempty"`
	// PreviousKey is the key the node rotated away from. Peers keep
	// accepting handshakes under it until PreviousUntil, so tunnels stay
	// up while the node switches keys; after that it is refused.
	PreviousKey   string    `json:"previous_key,omitempty"`
	PreviousUntil time.Time `json:"previous_until,omitempty"`
	// RotateRequested is when an operator asked for a new key (`control
	// mesh rotate`): the node rotates when it is later than KeyAge().
	RotateRequested time.Time `json:"rotate_requested,omitempty"`
}

func (r *MeshPeerRecord) version() int { return r.Version }

// KeyAge is when the record's key was registered.
func (r *MeshPeerRecord) KeyAge() time.Time {
	if !r.KeySince.IsZero() {
		return r.KeySince
	}
	return r.RegisteredAt
}

// RotationDue says the node should rotate its key: a rotation was asked
// for after its key was registered.
func (r *MeshPeerRecord) RotationDue() bool {
	return !r.Static && r.RotateRequested.After(r.KeyAge())
}

// PreviousValid says peers still accept PreviousKey at now.
func (r *MeshPeerRecord) PreviousValid(now time.Time) bool {
	return r.PreviousKey != "" && now.Before(r.PreviousUntil)
}

// MeshHeartbeat is a node's periodic liveness observation. Key:
// MeshBeatKey(machine).
type MeshHeartbeat struct {
	Version int       `json:"version"`
	Machine string    `json:"machine"`
	At      time.Time `json:"at"`
	// Interval is the sender's heartbeat interval; readers count missed
	// heartbeats against it.
	Interval Duration `json:"interval"`
	// Endpoint is the STUN-discovered (server-reflexive) address of the
	// node's WireGuard socket, "" if unknown.
	Endpoint    string `json:"endpoint,omitempty"`
	NATType     string `json:"nat_type,omitempty"`
	ListenPort  int    `json:"listen_port,omitempty"`
	PeersActive int    `json:"peers_active"`
	Mode        string `json:"mode,omitempty"`
	// Relay is the node's relayed address (ip:port on a mesh relay, see
	// MeshRelayReply): peers with no direct path send to it through their
	// own allocation on the same relay. "" when the node holds none.
	Relay string `json:"relay,omitempty"`
	// Relayed names the peers the node reaches through the mesh relay
	// now (at most MaxRelayedListed, sorted); PeersRelayed counts them
	// all. Every other active peer is reached directly.
	Relayed      []string `json:"relayed,omitempty"`
	PeersRelayed int      `json:"peers_relayed,omitempty"`
	// Release and Generation are what the node's meshd runs (stamped by
	// PutMeshBeat; empty from a meshd before announcements).
	Release    string `json:"release,omitempty"`
	Generation int    `json:"generation,omitempty"`
}

// MaxRelayedListed bounds the relayed peers a heartbeat names: the record
// must stay small.
const MaxRelayedListed = 64

func (r *MeshHeartbeat) version() int { return r.Version }

// Liveness states, computed when read.
const (
	LivenessAlive       = "alive"
	LivenessUnreachable = "unreachable" // 3 or more intervals missed
	LivenessOffline     = "offline"     // 10 or more intervals missed
	LivenessUnknown     = "unknown"     // no heartbeat seen
)

// Missed-heartbeat thresholds.
const (
	MeshUnreachableAfter = 3
	MeshOfflineAfter     = 10
)

// Liveness classifies hb as of now. A nil heartbeat is unknown.
func (hb *MeshHeartbeat) Liveness(now time.Time) string {
	if hb == nil || hb.Interval <= 0 {
		return LivenessUnknown
	}
	missed := now.Sub(hb.At) / time.Duration(hb.Interval)
	switch {
	case missed >= MeshOfflineAfter:
		return LivenessOffline
	case missed >= MeshUnreachableAfter:
		return LivenessUnreachable
	}
	return LivenessAlive
}

// MeshDriftReport is what a node's last reconcile found and corrected: an
// observation for operators, not truth. Key: MeshDriftKey(machine).
type MeshDriftReport struct {
	Version     int       `json:"version"`
	Machine     string    `json:"machine"`
	At          time.Time `json:"at"`
	Source      string    `json:"source"` // watch, poll or cache
	DesiredHash string    `json:"desired_hash"`
	ActualHash  string    `json:"actual_hash"` // before correction
	InSync      bool      `json:"in_sync"`
	Added       []string  `json:"added,omitempty"`
	Removed     []string  `json:"removed,omitempty"`
	Updated     []string  `json:"updated,omitempty"`
	// Dropped are peers left out of the active config because their
	// heartbeats say they are offline.
	Dropped []string `json:"dropped,omitempty"`
}

func (r *MeshDriftReport) version() int { return r.Version }

// MeshIPAllocation binds a mesh IP to a machine. Key: MeshIPKey(ip). When the
// machine leaves, the key is deleted and a cooldown marker
// (MeshIPCooldownKey) with a per-key TTL keeps the address out of the pool.
type MeshIPAllocation struct {
	Version int    `json:"version"`
	IP      string `json:"ip"`
	Machine string `json:"machine"`
	// SecretHash is the hex SHA-256 of the node secret the registrar handed
	// out at registration; leave must present the secret.
	SecretHash  string    `json:"secret_hash,omitempty"`
	AllocatedAt time.Time `json:"allocated_at"`
}

func (r *MeshIPAllocation) version() int { return r.Version }

// MeshIPCooldown marks a released address.
type MeshIPCooldown struct {
	Version    int       `json:"version"`
	IP         string    `json:"ip"`
	Machine    string    `json:"machine"` // the previous owner
	ReleasedAt time.Time `json:"released_at"`
	Until      time.Time `json:"until"`
}

func (r *MeshIPCooldown) version() int { return r.Version }

// Mesh KV keys.
func MeshPeerKey(machine string) string { return "peer." + machine }
func MeshBeatKey(machine string) string { return "beat." + machine }
func MeshDriftKey(machine string) string {
	return "drift." + machine
}
func MeshIPKey(ip netip.Addr) string { return "ip." + strings.ReplaceAll(ip.String(), ".", "-") }
func MeshIPCooldownKey(ip netip.Addr) string {
	return "cooldown." + strings.ReplaceAll(ip.String(), ".", "-")
}

// MeshIPFromKey parses the address out of an "ip." or "cooldown." key.
func MeshIPFromKey(key string) (netip.Addr, error) {
	_, rest, ok := strings.Cut(key, ".")
	if !ok {
		return netip.Addr{}, fmt.Errorf("mesh ip key %q: no prefix", key)
	}
	a, err := netip.ParseAddr(strings.ReplaceAll(rest, "-", "."))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("mesh ip key %q: %w", key, err)
	}
	return a, nil
}

// MeshRegisterRequest is what meshd sends to RegistrarSubject("register").
type MeshRegisterRequest struct {
	Version      int               `json:"version"`
	Token        string            `json:"token"`
	Machine      string            `json:"machine"`
	PublicKey    string            `json:"public_key"`
	Endpoints    []string          `json:"endpoints,omitempty"`
	Capabilities map[string]string `json:"capabilities,omitempty"`
}

// MeshRegisterReply is the registrar's answer.
type MeshRegisterReply struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	MeshIP  string `json:"mesh_ip"`
	Subnet  string `json:"subnet"`
	// Secret authenticates later requests of this node (leave); only its
	// hash is stored.
	Secret string `json:"secret"`
	// STUN lists the STUN servers the control plane runs (host:port).
	STUN         []string `json:"stun,omitempty"`
	Installation string   `json:"installation"`
	Authority    string   `json:"authority"`
}

// MeshLeaveRequest is what meshd sends to RegistrarSubject("leave").
type MeshLeaveRequest struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	Secret  string `json:"secret"`
}

// MeshLeaveReply confirms a leave.
type MeshLeaveReply struct {
	Version       int       `json:"version"`
	Machine       string    `json:"machine"`
	ReleasedIP    string    `json:"released_ip"`
	CooldownUntil time.Time `json:"cooldown_until"`
}

// Peer records are intent: the registrar writes them signed (PutMeshPeer,
// DeleteMeshPeer) and every reader verifies them, so nobody but the control
// plane can add a WireGuard peer to the mesh, change one's key or endpoints,
// or remove one.

// PutMeshPeer writes rec, signed, and returns its revision.
func (s *Store) PutMeshPeer(ctx context.Context, rec *MeshPeerRecord) (uint64, error) {
	rec.Version = RecordVersion
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("encoding peer record of %s: %w", rec.Machine, err)
	}
	ack, err := s.appendSigned(ctx, s.signerKey(), "KV_"+s.Names.MeshPeersBucket(), s.meshPeerSubject(rec.Machine), "", data, "")
	if err != nil {
		return 0, classify(fmt.Errorf("writing peer record of %s: %w", rec.Machine, err))
	}
	return ack.Sequence, nil
}

// DeleteMeshPeer removes machine's peer record with a signed delete marker.
func (s *Store) DeleteMeshPeer(ctx context.Context, machine string) error {
	if _, err := s.appendSigned(ctx, s.signerKey(), "KV_"+s.Names.MeshPeersBucket(), s.meshPeerSubject(machine), "DEL", nil, ""); err != nil {
		return classify(fmt.Errorf("removing peer record of %s: %w", machine, err))
	}
	return nil
}

func (s *Store) meshPeerSubject(machine string) string {
	return "$KV." + s.Names.MeshPeersBucket() + "." + MeshPeerKey(machine)
}

// MeshPeer reads machine's peer record, verified. A missing record is
// not_found; one that does not verify is bad_signature.
func (s *Store) MeshPeer(ctx context.Context, machine string) (*MeshPeerRecord, error) {
	var found *StoredMsg
	if err := s.LastOf(ctx, "KV_"+s.Names.MeshPeersBucket(), []string{s.meshPeerSubject(machine)}, func(m *StoredMsg) error {
		found = m
		return nil
	}); err != nil {
		return nil, err
	}
	if found == nil {
		return nil, Errorf(CodeNotFound, "machine %s has no mesh peer record", machine).With("machine", machine)
	}
	rec, err := s.VerifyMeshPeer(ctx, found)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, Errorf(CodeNotFound, "machine %s has no mesh peer record", machine).With("machine", machine)
	}
	return rec, nil
}

// VerifyMeshPeer checks m, a message of the mesh peers bucket (read, or as
// republished), and returns its record: nil for a signed delete marker.
func (s *Store) VerifyMeshPeer(ctx context.Context, m *StoredMsg) (*MeshPeerRecord, error) {
	prefix := "$KV." + s.Names.MeshPeersBucket() + "."
	key := strings.TrimPrefix(m.Subject, prefix)
	if err := s.Verify(ctx, "KV_"+s.Names.MeshPeersBucket(), m); err != nil {
		return nil, refusedIntent("mesh peer record "+key, err)
	}
	if m.Header.Get(kvOperationHeader) != "" {
		return nil, nil
	}
	var rec MeshPeerRecord
	if err := DecodeKeyed(s.Names.MeshPeersBucket(), key, m.Data, &rec); err != nil {
		return nil, &Error{Code: CodeInvalid, Message: err.Error()}
	}
	return &rec, nil
}

// MeshPeerState reads every peer record, verified: the live ones by
// machine, and why each machine whose latest record does not verify was
// refused (a reader keeps what it had for those).
func (s *Store) MeshPeerState(ctx context.Context) (peers map[string]MeshPeerRecord, refused map[string]error, err error) {
	prefix := "$KV." + s.Names.MeshPeersBucket() + ".peer."
	latest := map[string]*StoredMsg{}
	if _, err := s.ReadFrom(ctx, "KV_"+s.Names.MeshPeersBucket(), 1, prefix+">", func(m *StoredMsg) error {
		latest[strings.TrimPrefix(m.Subject, prefix)] = m
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("listing mesh peers: %w", err)
	}
	peers, refused = map[string]MeshPeerRecord{}, map[string]error{}
	for machine, m := range latest {
		rec, err := s.VerifyMeshPeer(ctx, m)
		switch {
		case HasCode(err, CodeBadSignature) || HasCode(err, CodeInvalid):
			SkippedRecords.Add(1)
			refused[machine] = err
		case err != nil:
			return nil, nil, err
		case rec != nil:
			peers[machine] = *rec
		}
	}
	return peers, refused, nil
}

// MeshPeerList returns every verified peer record, by machine ID; records
// that do not verify are left out (and counted in SkippedRecords).
func (s *Store) MeshPeerList(ctx context.Context) ([]MeshPeerRecord, error) {
	peers, _, err := s.MeshPeerState(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]MeshPeerRecord, 0, len(peers))
	for _, r := range peers {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out, nil
}

// MeshHeartbeats returns every heartbeat by machine.
func (s *Store) MeshHeartbeats(ctx context.Context) (map[string]MeshHeartbeat, error) {
	out := make(map[string]MeshHeartbeat)
	err := ListJSON(ctx, s, s.meshBeats, "beat.>", func(_ string, r *MeshHeartbeat) error {
		out[r.Machine] = *r
		return nil
	})
	return out, err
}

// Per-pair preshared keys. Every pair of meshd nodes shares a WireGuard
// preshared key (a second secret in the handshake besides the two nodes'
// keys) that only those two nodes are told: a node's mesh credentials ask
// the registrar for the keys of its own pairs, on its own machine's subject
// (RegistrarSubject("psk.<machine>")), proving itself with its node secret
// too. Keys are derived from one secret the control plane keeps
// (MeshPSKSecretKey in MeshKeysBucket), so nothing grows with the square
// of the fleet.

// MeshCapPSK is the peer record capability of a node that uses per-pair
// preshared keys (value "v1"); a pair uses its key only when both records
// carry it, so a node joined before them keeps connecting without.
const MeshCapPSK = "psk"

// MeshPSKSecretKey is the derivation secret's key in MeshKeysBucket.
const MeshPSKSecretKey = "psk_secret"

// MaxPSKPeers bounds the peers one PSK request names.
const MaxPSKPeers = 1024

// MeshPSKRequest asks for the preshared keys of the asking node's pairs
// with Peers.
type MeshPSKRequest struct {
	Version int      `json:"version"`
	Machine string   `json:"machine"`
	Secret  string   `json:"secret"`
	Peers   []string `json:"peers"`
}

// MeshPSKReply holds a base64 key per peer that has one: meshd nodes
// registered through the registrar (a static peer, a plain WireGuard
// endpoint, has none).
type MeshPSKReply struct {
	Version int               `json:"version"`
	PSKs    map[string]string `json:"psks"`
}

// MeshPSKSecret returns the derivation secret, creating it on first use;
// concurrent first uses agree on one.
func (s *Store) MeshPSKSecret(ctx context.Context) ([]byte, error) {
	return s.meshSecret(ctx, MeshPSKSecretKey)
}

// MeshRelaySecret returns the secret mesh relays check TURN credentials
// against, creating it on first use.
func (s *Store) MeshRelaySecret(ctx context.Context) ([]byte, error) {
	return s.meshSecret(ctx, MeshRelaySecretKey)
}

// meshSecret reads the 32-byte secret at key in MeshKeysBucket, creating it
// on first use; concurrent first uses agree on one.
func (s *Store) meshSecret(ctx context.Context, key string) ([]byte, error) {
	for range 3 {
		ent, err := s.meshKeys.Get(ctx, key)
		if err == nil {
			if len(ent.Value()) != 32 {
				return nil, Errorf(CodeInternal, "%s/%s holds %d bytes, want 32", s.meshKeys.Bucket(), key, len(ent.Value()))
			}
			return ent.Value(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, classify(fmt.Errorf("reading the mesh secret %s: %w", key, err))
		}
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
		if _, err := s.meshKeys.Create(ctx, key, secret); err == nil {
			return secret, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, classify(fmt.Errorf("creating the mesh secret %s: %w", key, err))
		}
		// Another control server created it first: read theirs.
	}
	return nil, Errorf(CodeUnavailable, "the mesh secret %s could not be read or created", key)
}

// Key rotation. A node rotates its WireGuard key without dropping a tunnel:
// it asks the registrar, on its own machine's subject
// (RegistrarSubject("rotate.<machine>")) and with its node secret, to
// register a new public key; the record then carries the old one as
// PreviousKey until PreviousUntil. Peers hold both keys for that overlap and
// move the node's mesh IP to the new key once a handshake under it
// completes; the node switches its device to the new key shortly after the
// record changed.

// DefaultMeshKeyOverlap is how long peers accept a rotated-away key.
const DefaultMeshKeyOverlap = 5 * time.Minute

// MaxMeshKeyOverlap bounds the overlap a node may ask for.
const MaxMeshKeyOverlap = 24 * time.Hour

// MeshRotateRequest registers PublicKey as the asking node's new key.
type MeshRotateRequest struct {
	Version   int    `json:"version"`
	Machine   string `json:"machine"`
	Secret    string `json:"secret"`
	PublicKey string `json:"public_key"`
	// Overlap is how long peers keep accepting the old key; zero:
	// DefaultMeshKeyOverlap.
	Overlap Duration `json:"overlap,omitempty"`
}

// MeshRotateReply is the record as the rotation left it.
type MeshRotateReply struct {
	Version int            `json:"version"`
	Record  MeshPeerRecord `json:"record"`
}

// Relays. Two nodes with no direct UDP path (both behind NATs that map
// every flow anew, or a firewall between them) reach each other through a
// TURN relay that `control server --mesh-relay` runs: each node allocates a
// relayed address there and announces it in its heartbeat. A node asks the
// registrar, on its own subject (RegistrarSubject("relay.<machine>")) with
// its node secret, for the relays and short-lived credentials for them.

// MeshRelaySecretKey is the relay credential secret's key in MeshKeysBucket.
const MeshRelaySecretKey = "relay_secret"

// MeshRelayCredentialTTL is how long relay credentials stay valid.
const MeshRelayCredentialTTL = 12 * time.Hour

// MeshRelayRequest asks for relay credentials.
type MeshRelayRequest struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	Secret  string `json:"secret"`
}

// MeshRelayReply lists the relays (host:port, UDP) in the order nodes
// should try them, and TURN credentials valid on each until Expires.
type MeshRelayReply struct {
	Version  int       `json:"version"`
	Servers  []string  `json:"servers"`
	Username string    `json:"username,omitempty"`
	Password string    `json:"password,omitempty"`
	Expires  time.Time `json:"expires,omitempty"`
}
