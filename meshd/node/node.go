package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/edgeplane/edgeplane/store"
)

// Defaults of the node's intervals.
const (
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultReconcileInterval = 60 * time.Second
	DefaultSTUNInterval      = 60 * time.Second
	DefaultWatchFallback     = 5 * time.Minute
)

// Config is `meshd run`'s input. Zero durations take the defaults.
type Config struct {
	DataDir string
	// NATSURL overrides the URL saved at join.
	NATSURL string
	// CredsFile overrides the NATS credentials saved at join.
	CredsFile string
	// CAFile overrides the CA bundle saved at join.
	CAFile string
	// TrustRoot overrides the trust root saved at join: the key peer
	// records must be signed under.
	TrustRoot string
	// STUN overrides the servers the registrar announced.
	STUN              []string
	HeartbeatInterval time.Duration
	ReconcileInterval time.Duration
	STUNInterval      time.Duration
	// WatchFallback is how long the peer watch may be down before the node
	// polls the full state every reconcile interval.
	WatchFallback time.Duration
	// KeyOverlap is how long peers keep accepting this node's old key
	// after it rotates; zero: store.DefaultMeshKeyOverlap.
	KeyOverlap time.Duration
	// RotatePrepare is how long the node waits after registering a new
	// key before switching to it, for peers to add it.
	RotatePrepare time.Duration
	// RelayAfter is how long a peer with no session may go unheard over
	// the direct path before the node sends through the mesh relay.
	RelayAfter time.Duration
	// ProbeInterval is how often a relayed peer's direct path is probed.
	ProbeInterval time.Duration
	// MetricsAddr serves Prometheus metrics at /metrics when set.
	MetricsAddr string
	// NoSocket disables the status socket in the data dir.
	NoSocket bool
	Logger   *zap.Logger
}

// Node is a running mesh member.
type Node struct {
	cfg  Config
	st   *State
	key  Key
	log  *zap.Logger
	dev  *wg
	stun *stunClient
	kick chan struct{}
	// pskKick asks pskLoop to look for peers without a key.
	pskKick chan struct{}
	// rotateKick asks rotateLoop to look at this node's own record.
	rotateKick chan struct{}
	// relayKick asks relayLoop to allocate now (a new connection).
	relayKick chan struct{}
	// relayEchoes carries relay probes the relay delivered back.
	relayEchoes chan string
	// initiations is signalled when a handshake initiation arrives (see
	// reconcileLoop).
	initiations chan struct{}
	ready       chan struct{}
	met         *metrics
	stop        context.CancelFunc

	storeP atomic.Pointer[store.Store]
	// anchor is where the trust in peer records starts.
	anchor store.Anchor

	mu          sync.Mutex
	peers       map[string]store.MeshPeerRecord
	beats       map[string]store.MeshHeartbeat
	beatsAt     time.Time
	source      string // where peers came from: cache, watch or poll
	watchUp     bool
	watchLostAt time.Time
	lastSync    time.Time
	applied     map[Key]string
	names       map[Key]string
	dropped     []string
	nat         natResult
	lastDrift   *store.MeshDriftReport
	connected   bool
	member      bool
	// refusedRecords counts peer records whose signature did not verify;
	// lastRefusal says why the latest was refused.
	refusedRecords uint64
	lastRefusal    string
	// psks are the preshared keys of this node's pairs, by peer, and
	// pskReady that the registrar has told it them (see pskLoop).
	psks     map[string]Key
	pskReady bool
	pskErr   string
	// paths are this node's path choices per peer, seen the paths the
	// device used, and forceEndpoint the peers whose endpoint the next
	// reconcile sets again (see path.go).
	paths         map[string]*pathChoice
	seen          map[Key]pathSeen
	forceEndpoint map[string]bool
	// relay is this node's allocation on a mesh relay (see relay.go).
	relay relayInfo
	// awaiting are the rotating peers' new keys the device has not heard
	// from, and switched those an initiation came under since (see
	// awaitSwitch).
	awaiting map[Key]Key
	switched map[Key]bool

	// applyMu makes reconciles one at a time: the initiation hook runs one
	// beside reconcileLoop's.
	applyMu sync.Mutex
	// devMu is held (read) by work on the device's receive path, and
	// devClosing, under it, says the device is closing: closing waits for
	// the receive path, so work there must not start after it (see
	// closeDevice).
	devMu      sync.RWMutex
	devClosing bool
}

// New loads the data dir; Run starts everything.
func New(cfg Config) (*Node, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("a data dir is required (--data)")
	}
	st, err := LoadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if cfg.NATSURL != "" {
		st.NATSURL = cfg.NATSURL
	}
	if cfg.CredsFile != "" {
		st.CredsFile = cfg.CredsFile
	}
	if cfg.CAFile != "" {
		st.CAFile = cfg.CAFile
	}
	// A missing or broken credentials file is a configuration error: say
	// so now rather than retry a connection that can never succeed.
	if st.CredsFile, err = checkCreds(st.CredsFile); err != nil {
		return nil, err
	}
	if cfg.TrustRoot != "" {
		st.TrustRoot = cfg.TrustRoot
	}
	anchor, err := store.ResolveAnchor(st.TrustRoot, st.CredsFile, filepath.Join(cfg.DataDir, trustPinFile))
	if err != nil {
		return nil, err
	}
	key, err := LoadOrCreateKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if len(cfg.STUN) > 0 {
		st.STUN = cfg.STUN
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&cfg.ReconcileInterval, DefaultReconcileInterval)
	def(&cfg.STUNInterval, DefaultSTUNInterval)
	def(&cfg.WatchFallback, DefaultWatchFallback)
	def(&cfg.KeyOverlap, store.DefaultMeshKeyOverlap)
	def(&cfg.RotatePrepare, DefaultRotatePrepare)
	def(&cfg.RelayAfter, DefaultRelayAfter)
	def(&cfg.ProbeInterval, DefaultProbeInterval)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cache, err := loadPeerCache(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if key, err = adoptNextKey(cfg.DataDir, key, cache.Peers[st.Machine]); err != nil {
		return nil, fmt.Errorf("finishing an interrupted key rotation: %w", err)
	}
	n := &Node{
		cfg: cfg, st: st, key: key, anchor: anchor, log: cfg.Logger.With(zap.String("machine", st.Machine)),
		kick: make(chan struct{}, 1), pskKick: make(chan struct{}, 1), rotateKick: make(chan struct{}, 1),
		relayKick: make(chan struct{}, 1), relayEchoes: make(chan string, 4), initiations: make(chan struct{}, 1), ready: make(chan struct{}),
		peers: cache.Peers, beats: cache.Beats, beatsAt: cache.SavedAt, source: "cache",
		applied: make(map[Key]string), names: make(map[Key]string), switched: make(map[Key]bool), member: true,
		psks: make(map[string]Key), pskReady: cache.PSKReady,
		paths: map[string]*pathChoice{}, seen: map[Key]pathSeen{}, forceEndpoint: map[string]bool{},
	}
	if n.beats == nil {
		n.beats = map[string]store.MeshHeartbeat{}
	}
	for m, v := range cache.PSKs {
		if k, err := ParseKey(v); err == nil {
			n.psks[m] = k
		}
	}
	n.met = newMetrics(n)
	return n, nil
}

// State is the membership the node runs with.
func (n *Node) State() State { return *n.st }

// PublicKey is the node's WireGuard public key.
func (n *Node) PublicKey() Key {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.key.Public()
}

// Ready is closed once the device is up with the cached peers applied.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Net is the userspace network stack in netstack mode (nil in TUN mode):
// dial and listen on the mesh through it.
func (n *Node) Net() *netstack.Net {
	if n.dev == nil {
		return nil
	}
	return n.dev.net
}

// Interface is the TUN interface name ("netstack" in netstack mode).
func (n *Node) Interface() string {
	if n.dev == nil {
		return ""
	}
	return n.dev.iface
}

// Run brings the device up from the cached state, then connects to the
// control plane in the background; it returns when ctx ends (or Shutdown is
// called), after tearing the device down.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.mu.Lock()
	n.stop = cancel
	n.mu.Unlock()

	if err := n.checkFloor(ctx); err != nil {
		return err
	}
	dev, err := openDevice(n.st, n.key, func(f string, a ...any) { n.log.Sugar().Debugf("wireguard: "+f, a...) })
	if err != nil {
		return err
	}
	n.dev = dev
	defer n.closeDevice(dev)
	dev.demux.OnInitiation(func(pkt []byte) func() { return n.awaitSwitch(ctx, pkt) })
	dev.demux.OnRelayProbe(func(pkt []byte) {
		select {
		case n.relayEchoes <- string(pkt):
		default:
		}
	})
	n.stun = newSTUNClient(dev.demux)
	n.log.Info("mesh device up", zap.String("interface", dev.iface), zap.String("mesh_ip", n.st.MeshIP),
		zap.Int("listen_port", n.st.ListenPort), zap.String("mode", n.st.Mode), zap.Int("cached_peers", len(n.peers)))

	// Tunnels to known peers come back before (and without) the control plane.
	n.reconcile(ctx, false)

	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	if !n.cfg.NoSocket {
		stopSock, err := n.serveSocket(ctx)
		if err != nil {
			return err
		}
		defer stopSock()
	}
	if n.cfg.MetricsAddr != "" {
		stopMet, err := n.met.serve(n.cfg.MetricsAddr)
		if err != nil {
			return err
		}
		defer stopMet()
	}
	close(n.ready)
	run(n.controlLoop)
	run(n.pskLoop)
	run(n.rotateLoop)
	run(n.relayLoop)
	run(n.probeLoop)
	run(n.reconcileLoop)
	run(n.stunLoop)
	<-ctx.Done()
	wg.Wait()
	n.log.Info("mesh device down", zap.String("interface", dev.iface))
	return nil
}

// closeDevice closes dev once no work runs on its receive path: wireguard-go
// holds its bind lock while it waits for the receive path to return, and a
// UAPI call there would wait for that lock.
func (n *Node) closeDevice(dev *wg) {
	n.devMu.Lock()
	n.devClosing = true
	n.devMu.Unlock()
	dev.close()
}

// Shutdown stops Run.
func (n *Node) Shutdown() {
	n.mu.Lock()
	stop := n.stop
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (n *Node) requestApply() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) requestPSKs() {
	select {
	case n.pskKick <- struct{}{}:
	default:
	}
}

// repeat runs f now, then every interval and whenever kick fires, until ctx
// ends.
func repeat(ctx context.Context, every time.Duration, kick <-chan struct{}, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}

// reconcileLoop applies watch changes as they come and runs the full
// reconcile (heartbeats re-read, drift report) every interval.
//
// A peer rotating its key needs more: its mesh IP moves to the new key as
// soon as a handshake under it completes (soon polls the device for that
// meanwhile), and its old key goes when the overlap ends.
func (n *Node) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.ReconcileInterval)
	defer t.Stop()
	soon := time.NewTimer(time.Hour)
	defer soon.Stop()
	var ds desiredSet
	// burst counts the quick looks left after a handshake initiation
	// arrived while a peer is rotating: WireGuard checks the initiation
	// on its own goroutine, so the first look may come too early.
	burst := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
			ds = n.reconcile(ctx, false)
		case <-n.initiations:
			if !ds.Rotating {
				continue
			}
			burst = rotateBurst
			ds = n.reconcile(ctx, false)
		case <-soon.C:
			ds = n.reconcile(ctx, false)
		case <-t.C:
			n.pollIfWatchLost(ctx)
			n.refreshBeats(ctx)
			ds = n.reconcile(ctx, true)
		}
		next := time.Hour
		if ds.Rotating && burst > 0 {
			burst--
			next = rotateBurstPoll
		} else if ds.Rotating {
			burst = 0
			next = rotateFastPoll
		} else if !ds.Expires.IsZero() {
			next = max(time.Until(ds.Expires), 0) + 10*time.Millisecond
		}
		soon.Reset(next)
	}
}

// reconcile diffs the desired peers against the device by hash and corrects
// drift. With report it publishes a drift report (an observation).
// It returns the desired set it applied (empty when it could not).
func (n *Node) reconcile(ctx context.Context, report bool) desiredSet {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	actual, err := n.dev.peers()
	if err != nil {
		n.log.Error("reading device peers", zap.Error(err))
		return desiredSet{}
	}
	now := time.Now()
	n.mu.Lock()
	n.observePaths(actual, now)
	force := n.choosePaths(actual, now)
	for m := range n.forceEndpoint {
		force[m] = true
	}
	clear(n.forceEndpoint)
	ds := computeDesired(desiredInputs{self: n.st.Machine, peers: n.peers, beats: n.beats, beatsAt: n.beatsAt,
		myReflexive: n.nat.Endpoint, psk: n.pskOf, actual: actual, switched: n.switched, now: now, endpoint: n.endpointFor})
	n.awaiting = ds.Awaiting
	for k := range n.switched {
		if _, ok := ds.Peers[k]; !ok {
			delete(n.switched, k)
		}
	}
	applied := make(map[Key]string, len(n.applied))
	for k, v := range n.applied {
		applied[k] = v
	}
	var shake []Key
	for k, p := range ds.Peers {
		n.names[k] = p.Machine
		if force[p.Machine] {
			delete(applied, k)
			shake = append(shake, k)
		}
	}
	source := n.source
	n.mu.Unlock()

	p := diff(ds, actual, applied, n.nameOf)
	if p.uapi.Len() > 0 {
		if err := n.dev.dev.IpcSet(p.uapi.String()); err != nil {
			n.log.Error("applying peer config", zap.Error(err))
			n.met.reconcileErrors.Inc()
			return desiredSet{}
		}
	}
	n.keepaliveNow(shake)
	n.mu.Lock()
	for k := range actual {
		if _, ok := ds.Peers[k]; !ok {
			delete(n.applied, k)
		}
	}
	for k, d := range ds.Peers {
		if d.Endpoint != "" {
			n.applied[k] = d.Endpoint
		}
	}
	n.dropped = ds.Dropped
	n.mu.Unlock()
	n.met.observeReconcile(p, len(ds.Peers), len(ds.Dropped))
	changed := len(p.added)+len(p.removed)+len(p.updated)+p.endpointsChanged > 0
	if changed && source != "cache" && !report {
		// The cache follows every change, so a restart without the
		// control plane comes back with the latest peers (a report saves
		// it below in any case).
		n.saveCache()
	}
	if len(p.added)+len(p.removed)+len(p.updated) > 0 {
		n.log.Info("mesh peers corrected", zap.String("source", source), zap.Strings("added", p.added),
			zap.Strings("removed", p.removed), zap.Strings("updated", p.updated), zap.Strings("dropped_offline", ds.Dropped))
	}
	if !report {
		return ds
	}
	// Hashes of the desired set and of the device as it was before this
	// correction: only the drift report needs them.
	want, have := ds.hash(), actualHash(actual)
	rep := &store.MeshDriftReport{
		Version: store.RecordVersion, Machine: n.st.Machine, At: time.Now().UTC(), Source: source,
		DesiredHash: want, ActualHash: have, InSync: want == have,
		Added: p.added, Removed: p.removed, Updated: p.updated, Dropped: ds.Dropped,
	}
	n.mu.Lock()
	n.lastDrift = rep
	n.mu.Unlock()
	n.saveCache()
	if s := n.storeP.Load(); s != nil && s.NC.IsConnected() {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := s.PutMeshDrift(cctx, *rep); err != nil {
			n.log.Debug("publishing drift report", zap.Error(err))
		}
	}
	return ds
}

// pskOf is the key of this node's pair with machine, zero until the
// registrar has told it; n.mu is held.
func (n *Node) pskOf(machine string) Key { return n.psks[machine] }

func (n *Node) nameOf(k Key) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m, ok := n.names[k]; ok {
		return m
	}
	return k.String()
}

func (n *Node) saveCache() {
	n.mu.Lock()
	c := PeerCache{Version: store.RecordVersion, SavedAt: n.beatsAt, Peers: make(map[string]store.MeshPeerRecord, len(n.peers)),
		Beats: make(map[string]store.MeshHeartbeat, len(n.beats))}
	for k, v := range n.peers {
		c.Peers[k] = v
	}
	for k, v := range n.beats {
		c.Beats[k] = v
	}
	c.PSKReady = n.pskReady
	if len(n.psks) > 0 {
		c.PSKs = make(map[string]string, len(n.psks))
		for m, k := range n.psks {
			c.PSKs[m] = k.String()
		}
	}
	n.mu.Unlock()
	if err := saveJSON(n.cfg.DataDir, peersFile, c); err != nil {
		n.log.Warn("saving peer cache", zap.Error(err))
	}
}

// stunLoop discovers the WireGuard socket's public mapping now and every
// STUN interval; a change triggers a heartbeat so peers learn it.
func (n *Node) stunLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		servers := append([]string(nil), n.st.STUN...)
		n.mu.Unlock()
		if len(servers) > 0 {
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res := n.stun.discover(qctx, servers, n.dev.port)
			cancel()
			n.mu.Lock()
			changed := res.Endpoint != n.nat.Endpoint || res.Type != n.nat.Type
			n.nat = res
			n.mu.Unlock()
			if changed {
				n.log.Info("nat discovery", zap.String("endpoint", res.Endpoint), zap.String("type", res.Type), zap.String("error", res.Error))
				n.heartbeat(ctx)
			}
		}
		t.Reset(n.cfg.STUNInterval)
	}
}

func (n *Node) String() string { return fmt.Sprintf("meshd node %s (%s)", n.st.Machine, n.st.MeshIP) }
