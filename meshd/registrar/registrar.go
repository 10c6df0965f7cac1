// Package registrar admits meshd nodes into the WireGuard mesh. It runs
// inside `control server`: it answers register and leave requests on
// store.Names.RegistrarSubject, redeems invites, and allocates each node a
// stable /32 from the mesh subnet under the subnet lease. A released address
// returns to the pool only after a cooldown, so a peer that still caches the
// old owner's address never reaches a new owner.
package registrar

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/device"

	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
)

// DefaultCooldown is how long a released mesh IP stays out of the pool.
const DefaultCooldown = 10 * time.Minute

// Config tunes the registrar. The zero value is usable.
type Config struct {
	// Subnet is the mesh range; default store.MeshSubnet (10.100.0.0/16).
	Subnet string
	// Cooldown keeps a released IP out of the pool; default DefaultCooldown.
	// The store expires cooldown markers with one-second granularity.
	Cooldown time.Duration
	// STUN lists host:port addresses of the STUN servers nodes should use;
	// they learn them from the register reply.
	STUN []string
	// Relays lists host:port addresses of mesh relays, in the order nodes
	// try them; nodes learn them with their relay credentials. Every
	// registrar of a mesh should list the same relays in the same order:
	// two nodes reach each other only through a relay both allocated on.
	Relays []string
	// Holder names this registrar in the subnet lease; default hostname.
	Holder string
	// LeaseWait bounds how long a request waits for a subnet lease another
	// registrar holds before failing with busy; default 5s.
	LeaseWait time.Duration
	Logger    *zap.Logger
}

// Registrar allocates mesh membership. Use Serve to answer requests, or call
// its methods directly (tests, `control` subcommands).
type Registrar struct {
	st     *store.Store
	cfg    Config
	subnet netip.Prefix
	log    *zap.Logger
	mu     sync.Mutex // serialises this process's allocations
}

// New validates cfg and returns a Registrar over st.
func New(st *store.Store, cfg Config) (*Registrar, error) {
	if st == nil {
		return nil, errors.New("registrar: a store is required")
	}
	if cfg.Subnet == "" {
		cfg.Subnet = store.MeshSubnet
	}
	p, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		return nil, fmt.Errorf("registrar: subnet %q: want an IPv4 prefix of /30 or wider", cfg.Subnet)
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.Cooldown < time.Second {
		return nil, fmt.Errorf("registrar: cooldown %s below the store's 1s TTL granularity", cfg.Cooldown)
	}
	if cfg.Holder == "" {
		cfg.Holder = "registrar@" + store.HostName("localhost")
	}
	if cfg.LeaseWait == 0 {
		cfg.LeaseWait = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Registrar{st: st, cfg: cfg, subnet: p.Masked(), log: cfg.Logger}, nil
}

// Serve starts a registrar answering store.Names.RegistrarSubject("register")
// and ("leave") until ctx ends or stop is called; stop waits for in-flight
// requests. It also answers the machine-bound forms "register.<machine>" and
// "leave.<machine>" that meshd uses: mesh credentials may publish only to
// their own machine's subjects, so NATS itself stops one machine's
// credentials from registering or removing another.
func Serve(ctx context.Context, st *store.Store, cfg Config) (stop func(), err error) {
	r, err := New(st, cfg)
	if err != nil {
		return nil, err
	}
	return r.Serve(ctx)
}

// Serve answers registrar requests; see the package-level Serve.
func (r *Registrar) Serve(ctx context.Context) (func(), error) {
	subj := r.st.Names.RegistrarSubject(">")
	stop, err := store.Serve(ctx, r.st.NC, subj, "registrar", "registrar", r.handle)
	if err != nil {
		return nil, fmt.Errorf("starting registrar: %w", err)
	}
	r.log.Info("mesh registrar serving", zap.String("subject", subj), zap.String("subnet", r.subnet.String()))
	return stop, nil
}

func (r *Registrar) handle(ctx context.Context, command string, data []byte) (any, error) {
	verb, bound, isBound := strings.Cut(command, ".")
	if isBound && !store.ValidToken(bound) {
		return nil, store.Errorf(store.CodeInvalid, "unknown registrar command %q (want register, leave, register.<machine>, leave.<machine>, psk.<machine>, rotate.<machine> or relay.<machine>)", command)
	}
	// The subject's machine is what the server checked the credentials
	// against; the request must be about that machine.
	checkBound := func(machine string) error {
		if isBound && machine != bound {
			return store.Errorf(store.CodeInvalid, "request for machine %q sent on machine %q's subject", machine, bound).
				With("machine", bound)
		}
		return nil
	}
	// psk, rotate and relay are answered only on the bound form: the
	// subject names who asks, which is what the server checked the
	// credentials against.
	if !isBound && (verb == "psk" || verb == "rotate" || verb == "relay") {
		return nil, store.Errorf(store.CodeInvalid, "%s requests are made on %s.<machine>", verb, verb)
	}
	switch verb {
	case "register":
		return answer(verb, data, checkBound, func(q *store.MeshRegisterRequest) string { return q.Machine },
			func(q store.MeshRegisterRequest) (any, error) { return r.Register(ctx, q) })
	case "psk":
		return answer(verb, data, checkBound, func(q *store.MeshPSKRequest) string { return q.Machine },
			func(q store.MeshPSKRequest) (any, error) { return r.PSKs(ctx, q) })
	case "rotate":
		return answer(verb, data, checkBound, func(q *store.MeshRotateRequest) string { return q.Machine },
			func(q store.MeshRotateRequest) (any, error) { return r.Rotate(ctx, q) })
	case "relay":
		return answer(verb, data, checkBound, func(q *store.MeshRelayRequest) string { return q.Machine },
			func(q store.MeshRelayRequest) (any, error) { return r.RelayCredentials(ctx, q) })
	case "leave":
		return answer(verb, data, checkBound, func(q *store.MeshLeaveRequest) string { return q.Machine },
			func(q store.MeshLeaveRequest) (any, error) { return r.Leave(ctx, q) })
	}
	return nil, store.Errorf(store.CodeInvalid, "unknown registrar command %q (want register, leave, register.<machine>, leave.<machine>, psk.<machine>, rotate.<machine> or relay.<machine>)", command)
}

// answer decodes data as a verb request, checks it is about the machine
// check allows, and answers it with do.
func answer[T any](verb string, data []byte, check func(machine string) error, machine func(*T) string, do func(T) (any, error)) (any, error) {
	var req T
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, store.Errorf(store.CodeInvalid, "decoding %s request: %w", verb, err)
	}
	if err := check(machine(&req)); err != nil {
		return nil, err
	}
	return do(req)
}

// PSKs tells a node the preshared keys of its pairs with req.Peers: the
// asker must be a registered meshd node holding its node secret, and each
// peer one too (a static peer has no key; an unknown one is left out).
func (r *Registrar) PSKs(ctx context.Context, req store.MeshPSKRequest) (*store.MeshPSKReply, error) {
	if req.Version > store.RecordVersion {
		return nil, store.Errorf(store.CodeInvalid, "psk request version %d is newer than this registrar (%d)", req.Version, store.RecordVersion)
	}
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: must be letters, digits, '-' or '_'", req.Machine)
	}
	if len(req.Peers) > store.MaxPSKPeers {
		return nil, store.Errorf(store.CodeInvalid, "%d peers in one psk request; at most %d", len(req.Peers), store.MaxPSKPeers)
	}
	if _, err := r.authenticate(ctx, req.Machine, req.Secret); err != nil {
		return nil, err
	}
	secret, err := r.st.MeshPSKSecret(ctx)
	if err != nil {
		return nil, err
	}
	out := &store.MeshPSKReply{Version: store.RecordVersion, PSKs: map[string]string{}}
	for _, peer := range req.Peers {
		if peer == req.Machine || !store.ValidToken(peer) {
			continue
		}
		rec, err := r.member(ctx, peer)
		if err != nil {
			return nil, err
		}
		if rec == nil || rec.Static {
			continue
		}
		k := PSK(secret, req.Machine, peer)
		out.PSKs[peer] = base64.StdEncoding.EncodeToString(k[:])
	}
	return out, nil
}

// authenticate checks that machine is a registered meshd node and secret
// its node secret, and returns its peer record.
func (r *Registrar) authenticate(ctx context.Context, machine, secret string) (*store.MeshPeerRecord, error) {
	self, err := r.member(ctx, machine)
	if err != nil {
		return nil, err
	}
	if self == nil || self.Static {
		return nil, store.Errorf(store.CodeNotFound, "machine %s is not a meshd node of this mesh", machine).With("machine", machine)
	}
	ip, err := netip.ParseAddr(self.MeshIP)
	if err != nil {
		return nil, store.Errorf(store.CodeInternal, "machine %s's peer record has mesh IP %q", machine, self.MeshIP)
	}
	alloc, _, err := r.st.MeshIP(ctx, ip)
	if err != nil {
		return nil, err
	}
	if alloc.Machine != machine || alloc.SecretHash == "" || !secretMatches(secret, alloc.SecretHash) {
		return nil, store.Errorf(store.CodeInvalid, "node secret does not match machine %s's registration", machine).
			With("machine", machine)
	}
	return self, nil
}

// Rotate registers req.PublicKey as the node's new key. The old one stays
// in the record as PreviousKey, accepted by peers for the overlap. Asking
// again with the key already registered changes nothing, so a node whose
// reply was lost retries safely with the same key.
func (r *Registrar) Rotate(ctx context.Context, req store.MeshRotateRequest) (*store.MeshRotateReply, error) {
	if req.Version > store.RecordVersion {
		return nil, store.Errorf(store.CodeInvalid, "rotate request version %d is newer than this registrar (%d)", req.Version, store.RecordVersion)
	}
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: must be letters, digits, '-' or '_'", req.Machine)
	}
	if _, err := ParseKey(req.PublicKey); err != nil {
		return nil, store.Errorf(store.CodeInvalid, "public key: %w", err)
	}
	overlap := time.Duration(req.Overlap)
	if overlap == 0 {
		overlap = store.DefaultMeshKeyOverlap
	}
	if overlap < time.Second || overlap > store.MaxMeshKeyOverlap {
		return nil, store.Errorf(store.CodeInvalid, "key overlap %s: want 1s to %s", overlap, store.MaxMeshKeyOverlap)
	}
	if _, err := r.authenticate(ctx, req.Machine, req.Secret); err != nil {
		return nil, err
	}
	rec, err := r.update(ctx, req.Machine, func(rec *store.MeshPeerRecord) (bool, error) {
		if rec.PublicKey == req.PublicKey {
			return false, nil
		}
		if other, err := r.keyOwner(ctx, req.PublicKey); err != nil {
			return false, err
		} else if other != "" {
			return false, store.Errorf(store.CodeConflict, "public key already belongs to machine %s", other).With("machine", other)
		}
		now := time.Now().UTC()
		rec.PreviousKey, rec.PreviousUntil = rec.PublicKey, now.Add(overlap)
		rec.PublicKey, rec.KeySince = req.PublicKey, now
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	r.log.Info("mesh node rotated its key", zap.String("machine", req.Machine), zap.Time("previous_until", rec.PreviousUntil))
	return &store.MeshRotateReply{Version: store.RecordVersion, Record: *rec}, nil
}

// RelayCredentials tells a node the mesh relays and TURN credentials for
// them in its own name, valid for store.MeshRelayCredentialTTL.
func (r *Registrar) RelayCredentials(ctx context.Context, req store.MeshRelayRequest) (*store.MeshRelayReply, error) {
	if req.Version > store.RecordVersion {
		return nil, store.Errorf(store.CodeInvalid, "relay request version %d is newer than this registrar (%d)", req.Version, store.RecordVersion)
	}
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: must be letters, digits, '-' or '_'", req.Machine)
	}
	if _, err := r.authenticate(ctx, req.Machine, req.Secret); err != nil {
		return nil, err
	}
	out := &store.MeshRelayReply{Version: store.RecordVersion, Servers: append([]string{}, r.cfg.Relays...)}
	if len(out.Servers) == 0 {
		return out, nil
	}
	secret, err := r.st.MeshRelaySecret(ctx)
	if err != nil {
		return nil, err
	}
	out.Username, out.Password, out.Expires, err = relay.Credentials(secret, req.Machine, store.MeshRelayCredentialTTL)
	if err != nil {
		return nil, store.Errorf(store.CodeInternal, "%w", err)
	}
	return out, nil
}

// RequestRotation asks machine's node to rotate its key (`control mesh
// rotate`): the node sees the request in its own peer record.
func (r *Registrar) RequestRotation(ctx context.Context, machine string) (*store.MeshPeerRecord, error) {
	return r.update(ctx, machine, func(rec *store.MeshPeerRecord) (bool, error) {
		if rec.Static {
			return false, store.Errorf(store.CodeInvalid, "machine %s is a static WireGuard peer: its key is its operator's, not meshd's", machine).
				With("machine", machine)
		}
		rec.RotateRequested = time.Now().UTC()
		return true, nil
	})
}

// update changes machine's peer record under the subnet lease, as admit
// writes it, so a rotation and a re-registration never interleave. change
// returns false to leave the record as it is.
func (r *Registrar) update(ctx context.Context, machine string, change func(*store.MeshPeerRecord) (bool, error)) (*store.MeshPeerRecord, error) {
	lease, unlock, err := r.locked(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := r.member(ctx, machine)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, store.Errorf(store.CodeNotFound, "machine %s is not in the mesh", machine).With("machine", machine)
	}
	changed, err := change(rec)
	if err != nil || !changed {
		return rec, err
	}
	if err := lease.Check(ctx); err != nil {
		return nil, err
	}
	if _, err := r.st.PutMeshPeer(ctx, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// member reads machine's peer record, verified; nil if it has none.
func (r *Registrar) member(ctx context.Context, machine string) (*store.MeshPeerRecord, error) {
	rec, err := r.st.MeshPeer(ctx, machine)
	if store.HasCode(err, store.CodeNotFound) {
		return nil, nil
	}
	return rec, err
}

// validate checks a register request before anything is touched.
func validateRegister(req *store.MeshRegisterRequest) error {
	if req.Version > store.RecordVersion {
		return store.Errorf(store.CodeInvalid, "register request version %d is newer than this registrar (%d)", req.Version, store.RecordVersion)
	}
	if !store.ValidToken(req.Machine) {
		return store.Errorf(store.CodeInvalid, "machine id %q: must be letters, digits, '-' or '_'", req.Machine)
	}
	if _, err := ParseKey(req.PublicKey); err != nil {
		return store.Errorf(store.CodeInvalid, "public key: %w", err)
	}
	if len(req.Endpoints) > 16 {
		return store.Errorf(store.CodeInvalid, "%d endpoints: at most 16", len(req.Endpoints))
	}
	for _, e := range req.Endpoints {
		if _, err := netip.ParseAddrPort(e); err != nil {
			return store.Errorf(store.CodeInvalid, "endpoint %q: want ip:port", e)
		}
	}
	return nil
}

// ParseKey decodes a base64 WireGuard key.
func ParseKey(s string) (device.NoisePublicKey, error) {
	var k device.NoisePublicKey
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("%q is not a base64 32-byte WireGuard key", s)
	}
	copy(k[:], b)
	return k, nil
}

// Register redeems req.Token for req.Machine and admits the node: the same
// machine registering again keeps its mesh IP (and gets a fresh secret); a
// new machine gets the lowest address that is neither allocated nor cooling
// down.
func (r *Registrar) Register(ctx context.Context, req store.MeshRegisterRequest) (*store.MeshRegisterReply, error) {
	if err := validateRegister(&req); err != nil {
		return nil, err
	}
	inv, err := invites.Redeem(ctx, r.st, req.Token, req.Machine, store.InviteUseMesh)
	if err != nil {
		return nil, err
	}
	secret, hash := newSecret()
	peer := store.MeshPeerRecord{
		Version: store.RecordVersion, Machine: req.Machine, PublicKey: req.PublicKey,
		Endpoints: req.Endpoints, Capabilities: req.Capabilities,
		Region: inv.Region, Labels: inv.Labels, RegisteredAt: time.Now().UTC(),
	}
	ip, err := r.admit(ctx, &peer, hash)
	if err != nil {
		return nil, err
	}
	r.log.Info("mesh node registered", zap.String("machine", req.Machine), zap.String("mesh_ip", ip.String()))
	return &store.MeshRegisterReply{
		Version: store.RecordVersion, Machine: req.Machine, MeshIP: ip.String(), Subnet: r.subnet.String(),
		Secret: secret, STUN: r.cfg.STUN,
		Installation: r.st.Names.Installation, Authority: r.st.Names.Authority,
	}, nil
}

// AddStatic admits a WireGuard peer that is not a meshd node (no invite, no
// heartbeats): an operator's way to bring a plain `wg` peer into the mesh.
// It returns the peer's mesh IP.
func (r *Registrar) AddStatic(ctx context.Context, machine, publicKey string, endpoints []string) (netip.Addr, error) {
	req := store.MeshRegisterRequest{Machine: machine, PublicKey: publicKey, Endpoints: endpoints}
	if err := validateRegister(&req); err != nil {
		return netip.Addr{}, err
	}
	peer := store.MeshPeerRecord{
		Version: store.RecordVersion, Machine: machine, PublicKey: publicKey, Endpoints: endpoints,
		Static: true, RegisteredAt: time.Now().UTC(),
	}
	return r.admit(ctx, &peer, "")
}

// admit allocates (or finds) the machine's IP and writes the allocation and
// the peer record, all under the subnet lease with a fencing check before
// each write.
func (r *Registrar) admit(ctx context.Context, peer *store.MeshPeerRecord, secretHash string) (netip.Addr, error) {
	lease, unlock, err := r.locked(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	defer unlock()

	used, owned, err := r.scan(ctx, peer.Machine)
	if err != nil {
		return netip.Addr{}, err
	}
	// A public key already used by another machine would make WireGuard
	// route both machines' traffic to one peer: refuse it.
	if other, err := r.keyOwner(ctx, peer.PublicKey); err != nil {
		return netip.Addr{}, err
	} else if other != "" && other != peer.Machine {
		return netip.Addr{}, store.Errorf(store.CodeConflict, "public key already belongs to machine %s", other).
			With("machine", other)
	}
	ip := owned
	if !ip.IsValid() {
		if ip, err = r.lowestFree(used); err != nil {
			return netip.Addr{}, err
		}
	}
	if err := lease.Check(ctx); err != nil {
		return netip.Addr{}, err
	}
	alloc := &store.MeshIPAllocation{IP: ip.String(), Machine: peer.Machine, SecretHash: secretHash, AllocatedAt: time.Now().UTC()}
	if err := r.st.PutMeshIP(ctx, alloc); err != nil {
		return netip.Addr{}, err
	}
	peer.MeshIP = ip.String()
	if err := lease.Check(ctx); err != nil {
		return netip.Addr{}, err
	}
	if _, err := r.st.PutMeshPeer(ctx, peer); err != nil {
		return netip.Addr{}, err
	}
	return ip, nil
}

// locked takes this process's allocation mutex and the subnet lease, which
// every write of allocations and peer records holds; unlock gives both
// back.
func (r *Registrar) locked(ctx context.Context) (lease *store.Lease, unlock func(), err error) {
	r.mu.Lock()
	if lease, err = r.lease(ctx); err != nil {
		r.mu.Unlock()
		return nil, nil, err
	}
	return lease, func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = lease.Release(rctx)
		r.mu.Unlock()
	}, nil
}

func (r *Registrar) lease(ctx context.Context) (*store.Lease, error) {
	key := store.SubnetLockKey(r.subnet.String())
	deadline := time.Now().Add(r.cfg.LeaseWait)
	for {
		l, err := r.st.AcquireLease(ctx, key, store.LeaseOptions{TTL: 15 * time.Second, Holder: r.cfg.Holder, Purpose: "mesh ip allocation"})
		if err == nil {
			return l, nil
		}
		// Another registrar is allocating: allocations take milliseconds,
		// so wait a bounded time, then fail loudly with its busy error.
		if !store.HasCode(err, store.CodeBusy) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, store.Classify(fmt.Errorf("waiting for %s: %w", key, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// scan returns every address that is allocated or cooling down, and the
// address already allocated to machine, if any.
func (r *Registrar) scan(ctx context.Context, machine string) (map[netip.Addr]bool, netip.Addr, error) {
	used := make(map[netip.Addr]bool)
	var owned netip.Addr
	err := r.st.ListMeshIPs(ctx, func(a *store.MeshIPAllocation) error {
		ip, err := netip.ParseAddr(a.IP)
		if err != nil {
			return fmt.Errorf("allocation record %q: %w", a.IP, err)
		}
		used[ip] = true
		if a.Machine == machine {
			owned = ip
		}
		return nil
	})
	if err != nil {
		return nil, netip.Addr{}, err
	}
	now := time.Now()
	err = r.st.ListMeshIPCooldowns(ctx, func(c *store.MeshIPCooldown) error {
		// The TTL marker removes the key; Until guards the gap before the
		// server gets to it.
		if ip, err := netip.ParseAddr(c.IP); err == nil && now.Before(c.Until.Add(time.Second)) {
			used[ip] = true
		}
		return nil
	})
	return used, owned, err
}

func (r *Registrar) keyOwner(ctx context.Context, pub string) (string, error) {
	peers, err := r.st.MeshPeerList(ctx)
	if err != nil {
		return "", err
	}
	now := time.Now()
	for _, p := range peers {
		if p.PublicKey == pub || (p.PreviousKey == pub && p.PreviousValid(now)) {
			return p.Machine, nil
		}
	}
	return "", nil
}

func (r *Registrar) lowestFree(used map[netip.Addr]bool) (netip.Addr, error) {
	first := r.subnet.Addr().Next() // skip the network address
	for ip := first; r.subnet.Contains(ip); ip = ip.Next() {
		if !r.subnet.Contains(ip.Next()) {
			break // the broadcast address
		}
		if !used[ip] {
			return ip, nil
		}
	}
	return netip.Addr{}, store.Errorf(store.CodeUnavailable, "mesh subnet %s is exhausted (including addresses cooling down)", r.subnet).
		With("subnet", r.subnet.String())
}

// Leave removes a node: its peer record, heartbeat and drift report go; its
// address enters cooldown. The node's secret must match.
func (r *Registrar) Leave(ctx context.Context, req store.MeshLeaveRequest) (*store.MeshLeaveReply, error) {
	return r.release(ctx, req.Machine, func(alloc *store.MeshIPAllocation) error {
		if alloc.SecretHash == "" || !secretMatches(req.Secret, alloc.SecretHash) {
			return store.Errorf(store.CodeInvalid, "node secret does not match machine %s's registration", req.Machine).
				With("machine", req.Machine)
		}
		return nil
	})
}

// Evict is Leave on an operator's word (`control machine rm`), without
// the node's secret: for a machine that is dead or stolen. A machine that
// is not a mesh member is not_found.
func (r *Registrar) Evict(ctx context.Context, machine string) (*store.MeshLeaveReply, error) {
	return r.release(ctx, machine, func(*store.MeshIPAllocation) error { return nil })
}

// release is Leave and Evict: allowed vets the allocation first.
func (r *Registrar) release(ctx context.Context, machine string, allowed func(*store.MeshIPAllocation) error) (*store.MeshLeaveReply, error) {
	req := store.MeshLeaveRequest{Machine: machine}
	if !store.ValidToken(req.Machine) {
		return nil, store.Errorf(store.CodeInvalid, "machine id %q: must be letters, digits, '-' or '_'", req.Machine)
	}
	lease, unlock, err := r.locked(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ip netip.Addr
	err = r.st.ListMeshIPs(ctx, func(a *store.MeshIPAllocation) error {
		if a.Machine == req.Machine {
			ip, _ = netip.ParseAddr(a.IP)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !ip.IsValid() {
		return nil, store.Errorf(store.CodeNotFound, "machine %s is not a mesh member", req.Machine).With("machine", req.Machine)
	}
	// The allocation again, with the revision its release is fenced on.
	alloc, rev, err := r.st.MeshIP(ctx, ip)
	if err != nil {
		return nil, err
	}
	if alloc.Machine != req.Machine {
		return nil, store.Errorf(store.CodeConflict, "mesh IP %s moved to machine %s", ip, alloc.Machine).With("machine", req.Machine)
	}
	if err := allowed(alloc); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	cool := &store.MeshIPCooldown{IP: ip.String(), Machine: req.Machine, ReleasedAt: now, Until: now.Add(r.cfg.Cooldown)}
	if err := lease.Check(ctx); err != nil {
		return nil, err
	}
	// The cooldown marker goes in before the allocation goes away, so no
	// moment exists where the address looks free.
	if err := r.st.PutMeshIPCooldown(ctx, cool, r.cfg.Cooldown); err != nil {
		return nil, err
	}
	if err := r.st.DeleteMeshPeer(ctx, req.Machine); err != nil {
		return nil, err
	}
	if err := r.st.ReleaseMeshIP(ctx, ip, rev); err != nil {
		return nil, err
	}
	// Observations of a departed node are noise; failing to remove them
	// is harmless.
	if err := r.st.DeleteMeshObservations(ctx, req.Machine); err != nil {
		r.log.Warn("removing a departed node's observations", zap.String("machine", req.Machine), zap.Error(err))
	}
	r.log.Info("mesh node left", zap.String("machine", req.Machine), zap.String("mesh_ip", ip.String()),
		zap.Time("cooldown_until", cool.Until))
	return &store.MeshLeaveReply{Version: store.RecordVersion, Machine: req.Machine, ReleasedIP: ip.String(), CooldownUntil: cool.Until}, nil
}

func newSecret() (secret, hash string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	secret = "epnode_" + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(secret))
	return secret, hex.EncodeToString(sum[:])
}

func secretMatches(secret, hash string) bool {
	if !strings.HasPrefix(secret, "epnode_") {
		return false
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:]) == hash
}

// PSK is the WireGuard preshared key of machines a and b (in either order)
// under the mesh's PSK secret: the registrar derives each pair's key on
// request, so no pair's key is stored, and one pair's key says nothing of
// another's.
func PSK(secret []byte, a, b string) [32]byte {
	if b < a {
		a, b = b, a
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("edgeplane mesh psk v1\x00" + a + "\x00" + b))
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}
