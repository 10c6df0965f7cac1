// Package node is meshd's agent: it joins the mesh through the registrar,
// runs a wireguard-go device (kernel TUN or netstack), keeps its peers in
// step with the mesh-peers KV, discovers its public endpoint with STUN on the
// WireGuard socket, heartbeats, reconciles drift, and keeps enough state in
// its data dir to restore tunnels when the control plane is down.
package node

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/curve25519"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
)

// Files in the data dir.
const (
	keyFile = "private.key" // base64 WireGuard private key, 0600
	// nextKeyFile holds a rotation's new key until the device runs on it.
	nextKeyFile = "private.key.next"
	stateFile   = "state.json" // membership: machine, mesh IP, secret, NATS
	peersFile   = "peers.json" // last known peer records and heartbeats
	SocketName  = "meshd.sock" // status and control socket
)

// State is a node's membership, written by join and read by run and leave.
type State struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	MeshIP  string `json:"mesh_ip"`
	Subnet  string `json:"subnet"`
	Secret  string `json:"secret"`
	NATSURL string `json:"nats_url"`
	// CredsFile is the absolute path of the NATS credentials join used;
	// run and leave reuse it ("" on a loopback control plane without auth).
	CredsFile string `json:"creds_file,omitempty"`
	// CAFile is the CA bundle join was given (--tls-ca), if any.
	CAFile string `json:"tls_ca_file,omitempty"`
	// TrustRoot is the trust root join was told (--trust-root); "" takes
	// the one the credentials carry, else the store's, pinned in the data
	// dir on first contact.
	TrustRoot    string    `json:"trust_root,omitempty"`
	Installation string    `json:"installation"`
	Authority    string    `json:"authority"`
	STUN         []string  `json:"stun,omitempty"`
	ListenPort   int       `json:"listen_port"`
	Bind         string    `json:"bind,omitempty"`
	Mode         string    `json:"mode"`
	Interface    string    `json:"interface,omitempty"`
	JoinedAt     time.Time `json:"joined_at"`
}

func (s *State) version() int { return s.Version }

// trustPinFile, in the data dir, keeps a trust root learned on first
// contact with the store.
const trustPinFile = "trust-root"

// PeerCache is the last desired peer set this node knew, so a restart with
// the control plane down restores tunnels to known peers.
type PeerCache struct {
	Version int                             `json:"version"`
	SavedAt time.Time                       `json:"saved_at"`
	Peers   map[string]store.MeshPeerRecord `json:"peers"`
	Beats   map[string]store.MeshHeartbeat  `json:"beats,omitempty"`
	// PSKs are the preshared keys of this node's pairs (base64, by peer)
	// and PSKReady that the registrar has told it them: a restart without
	// the control plane keeps using them.
	PSKs     map[string]string `json:"psks,omitempty"`
	PSKReady bool              `json:"psk_ready,omitempty"`
}

// ErrNotJoined means the data dir holds no membership.
var ErrNotJoined = errors.New("this data dir has not joined a mesh (run `meshd join --token ... --data DIR` first)")

// LoadState reads the membership in dir.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNotJoined
		}
		return nil, fmt.Errorf("reading state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, stateFile), err)
	}
	if s.Version > store.RecordVersion {
		return nil, fmt.Errorf("state version %d is newer than this meshd understands", s.Version)
	}
	return &s, nil
}

func saveJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(dir, name, b)
}

// writeFile replaces dir/name with b (mode 0600) whole or not at all.
func writeFile(dir, name string, b []byte) error {
	if err := atomicfile.Write(filepath.Join(dir, name), b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// SaveState writes s atomically.
func SaveState(dir string, s *State) error { return saveJSON(dir, stateFile, s) }

func loadPeerCache(dir string) (*PeerCache, error) {
	b, err := os.ReadFile(filepath.Join(dir, peersFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return &PeerCache{Peers: map[string]store.MeshPeerRecord{}}, nil
		}
		return nil, err
	}
	var c PeerCache
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("reading peer cache: %w", err)
	}
	if c.Peers == nil {
		c.Peers = map[string]store.MeshPeerRecord{}
	}
	return &c, nil
}

// Key is a WireGuard private key.
type Key [32]byte

// Public derives the public key.
func (k Key) Public() Key {
	var p Key
	pub, _ := curve25519.X25519(k[:], curve25519.Basepoint)
	copy(p[:], pub)
	return p
}

func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// Hex is the form wireguard-go's UAPI takes.
func (k Key) Hex() string { return hex.EncodeToString(k[:]) }

// ParseKey decodes base64.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return k, fmt.Errorf("%q is not a base64 32-byte key", s)
	}
	copy(k[:], b)
	return k, nil
}

// LoadOrCreateKey returns the node's private key, creating it on first use.
func LoadOrCreateKey(dir string) (Key, error) {
	return loadOrCreateKey(dir, keyFile)
}

func loadOrCreateKey(dir, name string) (Key, error) {
	k, found, err := loadKey(dir, name)
	if err != nil || found {
		return k, err
	}
	if k, err = newKey(); err != nil {
		return Key{}, err
	}
	return k, saveKey(dir, name, k)
}

// loadKey reads a private key file; found is false if there is none.
func loadKey(dir, name string) (k Key, found bool, err error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Key{}, false, nil
	}
	if err != nil {
		return Key{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	if k, err = ParseKey(string(trimSpace(b))); err != nil {
		return Key{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return k, true, nil
}

func newKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return Key{}, err
	}
	// Clamp as Curve25519 requires.
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// saveKey writes a private key file whole or not at all: a crash while a
// rotation replaces the key must leave one of the two keys, never neither.
func saveKey(dir, name string, k Key) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	return writeFile(dir, name, []byte(k.String()+"\n"))
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
