package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeplane/edgeplane/store"
)

// Backoff bounds for reconnecting to the control plane.
const (
	backoffMin = time.Second
	backoffMax = 60 * time.Second
)

// Backoff is the wait before reconnect attempt n (1-based): 1s doubling to
// 60s, with ±25% jitter so a fleet does not reconnect in lockstep after a
// control-plane restart.
func Backoff(attempt int) time.Duration {
	d := backoffMin
	for i := 1; i < attempt && d < backoffMax; i++ {
		d *= 2
	}
	if d > backoffMax {
		d = backoffMax
	}
	jitter := 0.75 + 0.5*rand.Float64()
	return time.Duration(float64(d) * jitter)
}

var errDisconnected = errors.New("control plane connection lost")

// controlLoop owns the NATS connection: it connects (retrying forever with
// backoff, the saved credentials and their inbox prefix), opens the store,
// runs the peer watch, and restarts the watch with backoff whenever it
// breaks. A connection the client gives up on (credentials refused on
// reconnect) is replaced by a fresh one.
func (n *Node) controlLoop(ctx context.Context) {
	names, err := store.NewNames(n.st.Installation, n.st.Authority)
	if err != nil {
		n.log.Error("store names", zap.Error(err))
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { defer wg.Done(); n.heartbeatLoop(ctx) }()

	disc := make(chan struct{}, 1)
	up := make(chan struct{}, 1)
	signal := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	attempt := 0
	for ctx.Err() == nil {
		nc, err := store.Connect(store.ConnectOptions{
			URL: n.st.NATSURL, CredsFile: n.st.CredsFile, CAFile: n.st.CAFile, Name: "meshd " + n.st.Machine, Timeout: 5 * time.Second,
			ReconnectForever: true, ReconnectDelay: Backoff,
			OnDisconnect: func(error) { n.setConnected(false); signal(disc) },
			OnReconnect:  func() { n.setConnected(true); signal(up) },
		})
		if err != nil {
			attempt++
			// One line per outage; the attempts after it at debug level.
			level := zapcore.DebugLevel
			if attempt == 1 {
				level = zapcore.WarnLevel
			}
			if c := n.log.Check(level, "cannot reach the control plane; running from the cached peers"); c != nil {
				c.Write(zap.Error(connectErr(err, n.st.CredsFile)), zap.Int("attempt", attempt))
			}
			if !sleepCtx(ctx, Backoff(attempt)) {
				return
			}
			continue
		}
		attempt = 0
		// The server refuses operations these credentials do not permit
		// without closing the connection; the only trace is this error.
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			n.log.Error("control plane refused an operation (are --creds mesh credentials for this machine?)",
				zap.Error(err), zap.String("creds", n.st.CredsFile))
		})
		n.setConnected(true)
		n.session(ctx, nc, names, up, disc)
		n.storeP.Store(nil)
		nc.Close()
		n.setConnected(false)
	}
}

// checkFloor refuses a meshd of a generation below the store's floor
// (a too_old error naming the release the store needs) when the store
// answers at start. A store that does not answer, or a floor these
// credentials cannot read, lets it start: tunnels to known peers come
// back without the control plane.
func (n *Node) checkFloor(ctx context.Context) error {
	names, err := store.NewNames(n.st.Installation, n.st.Authority)
	if err != nil {
		return nil // controlLoop reports it
	}
	nc, err := store.Connect(store.ConnectOptions{URL: n.st.NATSURL, CredsFile: n.st.CredsFile, CAFile: n.st.CAFile,
		Name: "meshd " + n.st.Machine + " (floor)", Timeout: 2 * time.Second})
	if err != nil {
		return nil // controlLoop retries and reports
	}
	defer nc.Close()
	s, err := store.Open(ctx, nc, names)
	if err != nil {
		return nil
	}
	switch err := s.CheckFloor(ctx, "meshd"); {
	case store.HasCode(err, store.CodeTooOld):
		return err
	case err != nil:
		n.log.Warn("could not read the store's floor", zap.Error(err))
	}
	return nil
}

func (n *Node) setConnected(v bool) {
	n.mu.Lock()
	n.connected = v
	n.mu.Unlock()
}

// session serves one connection until ctx ends or the client closes it.
func (n *Node) session(ctx context.Context, nc *nats.Conn, names store.Names, up, disc chan struct{}) {
	// The CA bundle storage nodes are verified against follows the
	// fleet's for as long as the session lasts (a CA rotation reaches
	// this node), and the credentials are renewed before they expire.
	fctx, stopFollow := context.WithCancel(ctx)
	var following sync.WaitGroup
	defer func() {
		stopFollow()
		following.Wait()
	}()
	attempt := 0
	for ctx.Err() == nil && !nc.IsClosed() {
		if !nc.IsConnected() {
			select {
			case <-ctx.Done():
				return
			case <-up:
			case <-time.After(time.Second):
			}
			continue
		}
		s := n.storeP.Load()
		if s == nil {
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			var err error
			s, err = store.Open(octx, nc, names)
			cancel()
			if err == nil {
				s.TrustAnchor(n.anchor)
			}
			if err != nil {
				attempt++
				n.log.Warn("opening store", zap.Error(err), zap.Int("attempt", attempt))
				if !sleepCtx(ctx, Backoff(attempt)) {
					return
				}
				continue
			}
			n.storeP.Store(s)
			if n.st.CredsFile != "" {
				following.Add(1)
				go func() {
					defer following.Done()
					store.FollowConnection(fctx, s, n.st.CredsFile, func(err error) {
						n.log.Warn("following the fleet's CA bundle and credentials", zap.Error(err))
					})
				}()
			}
			n.heartbeat(ctx)
		}
		select { // a stale disconnect signal from before this attempt
		case <-disc:
		default:
		}
		wasLive, err := n.watch(ctx, s, disc)
		n.mu.Lock()
		if n.watchUp {
			n.watchUp = false
			n.watchLostAt = time.Now()
		} else if n.watchLostAt.IsZero() {
			n.watchLostAt = time.Now()
		}
		n.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		n.met.watchRestarts.Inc()
		if wasLive {
			attempt = 0
		}
		attempt++
		n.log.Warn("peer watch ended; reconnecting", zap.Error(err), zap.Int("attempt", attempt))
		if !sleepCtx(ctx, Backoff(attempt)) {
			return
		}
	}
}

// watch reads the whole mesh-peers state into a fresh peer map (so removals
// made while disconnected are seen), swaps it in, reconciles at once, then
// applies the changes the bucket republishes as they are stored, reading
// the whole state again every reconcile interval in case one was lost. It
// returns when the connection breaks. meshd creates no consumer: its
// credentials allow none.
func (n *Node) watch(ctx context.Context, s *store.Store, disc <-chan struct{}) (bool, error) {
	changes := make(chan *nats.Msg, 256)
	sub, err := s.NC.ChanSubscribe(s.Names.MeshPeersRepublishedWildcard(), changes)
	if err != nil {
		return false, store.Classify(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// Signer certificates as they change: a retired key stops verifying
	// at once.
	signers := make(chan *nats.Msg, 64)
	ssub, err := s.NC.ChanSubscribe(s.Names.SignersRepublishedWildcard(), signers)
	if err != nil {
		return false, store.Classify(err)
	}
	defer func() { _ = ssub.Unsubscribe() }()
	if err := s.NC.Flush(); err != nil {
		return false, store.Classify(err)
	}
	resync := time.NewTicker(n.cfg.ReconcileInterval)
	defer resync.Stop()
	live := false
	load := func() error {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := s.LoadSigners(lctx); err != nil {
			return err
		}
		peers, refused, err := s.MeshPeerState(lctx)
		if err != nil {
			return err
		}
		n.mu.Lock()
		for machine, why := range refused {
			n.refusedRecord(machine, why)
			if old, ok := n.peers[machine]; ok {
				peers[machine] = old
			}
		}
		n.peers, n.source, n.watchUp, n.lastSync = peers, "watch", true, time.Now()
		n.watchLostAt = time.Time{}
		_, n.member = peers[n.st.Machine]
		n.mu.Unlock()
		return nil
	}
	if err := load(); err != nil {
		return false, err
	}
	live = true
	if !n.isMember() {
		n.log.Warn("this node has no peer record: it left or was removed from the mesh")
	}
	n.refreshBeats(ctx)
	n.reconcile(ctx, true)
	n.requestPSKs()
	n.requestRotate()
	select {
	case n.relayKick <- struct{}{}:
	default:
	}
	prefix := "$KV." + s.Names.MeshPeersBucket() + ".peer."
	for {
		select {
		case <-ctx.Done():
			return live, ctx.Err()
		case <-disc:
			return live, errDisconnected
		case <-resync.C:
			if err := load(); err != nil {
				return live, err
			}
			n.requestApply()
			n.requestPSKs()
			n.requestRotate()
		case m := <-signers:
			if sm, err := store.StoredFromMsg(m); err == nil {
				if err := s.ApplySignerMsg(ctx, sm); err != nil {
					n.log.Warn("signer certificate refused", zap.Error(err))
				}
			}
		case m := <-changes:
			sm, err := store.StoredFromMsg(m)
			if err != nil || !strings.HasPrefix(sm.Subject, prefix) {
				continue
			}
			machine := strings.TrimPrefix(sm.Subject, prefix)
			vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			rec, err := s.VerifyMeshPeer(vctx, sm)
			cancel()
			n.mu.Lock()
			switch {
			case store.HasCode(err, store.CodeBadSignature) || store.HasCode(err, store.CodeInvalid):
				n.refusedRecord(machine, err)
				n.mu.Unlock()
				continue
			case err != nil:
				n.mu.Unlock()
				return live, err // could not check: read everything again
			case rec == nil:
				delete(n.peers, machine)
			default:
				n.peers[machine] = *rec
			}
			n.lastSync = time.Now()
			if machine == n.st.Machine {
				_, n.member = n.peers[machine]
				n.requestRotate()
			}
			n.mu.Unlock()
			n.requestApply()
			n.requestPSKs()
		}
	}
}

// refusedRecord counts and logs a peer record that did not verify; the
// peer's last good record stays. n.mu is held.
func (n *Node) refusedRecord(machine string, err error) {
	reason := "invalid"
	var se *store.Error
	if errors.As(err, &se) && se.Detail["reason"] != "" {
		reason = se.Detail["reason"]
	}
	n.met.refused.WithLabelValues(reason).Inc()
	n.refusedRecords++
	n.lastRefusal = err.Error()
	n.log.Error("peer record refused; keeping the peer's last good record", zap.String("machine", machine), zap.Error(err))
}

func (n *Node) isMember() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.member
}

// pollIfWatchLost reads the full peer state when the watch has been down
// longer than the fallback, once per reconcile interval, until it recovers.
func (n *Node) pollIfWatchLost(ctx context.Context) {
	n.mu.Lock()
	lost := !n.watchUp && !n.watchLostAt.IsZero() && time.Since(n.watchLostAt) > n.cfg.WatchFallback
	n.mu.Unlock()
	s := n.storeP.Load()
	if !lost || s == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, refused, err := s.MeshPeerState(pctx)
	if err != nil {
		n.log.Debug("polling peers", zap.Error(err))
		return
	}
	n.mu.Lock()
	for machine, why := range refused {
		n.refusedRecord(machine, why)
		if old, ok := n.peers[machine]; ok {
			m[machine] = old
		}
	}
	n.peers, n.source, n.lastSync = m, "poll", time.Now()
	_, n.member = m[n.st.Machine]
	n.mu.Unlock()
	n.met.polls.Inc()
}

// refreshBeats re-reads every heartbeat; on failure the old snapshot stays.
func (n *Node) refreshBeats(ctx context.Context) {
	s := n.storeP.Load()
	if s == nil || !s.NC.IsConnected() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	at := time.Now()
	beats, err := s.MeshHeartbeats(rctx)
	if err != nil {
		n.log.Debug("reading heartbeats", zap.Error(err), zap.Duration("took", time.Since(at)))
		return
	}
	n.log.Debug("heartbeats read", zap.Int("n", len(beats)), zap.Duration("took", time.Since(at)))
	n.mu.Lock()
	n.beats, n.beatsAt = beats, at
	n.mu.Unlock()
}

func (n *Node) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.heartbeat(ctx)
		}
	}
}

// heartbeat writes this node's liveness observation.
func (n *Node) heartbeat(ctx context.Context) {
	s := n.storeP.Load()
	if s == nil || !s.NC.IsConnected() || !n.isMember() {
		return
	}
	n.mu.Lock()
	hb := store.MeshHeartbeat{
		Version: store.RecordVersion, Machine: n.st.Machine, At: time.Now().UTC(),
		Interval: store.Duration(n.cfg.HeartbeatInterval), Endpoint: n.nat.Endpoint, NATType: n.nat.Type,
		ListenPort: n.st.ListenPort, Mode: n.st.Mode, PeersActive: len(n.applied),
	}
	if n.relay.addr.IsValid() {
		hb.Relay = n.relay.addr.String()
	}
	for machine, c := range n.paths {
		if c.relayed {
			hb.PeersRelayed++
			hb.Relayed = append(hb.Relayed, machine)
		}
	}
	n.mu.Unlock()
	slices.Sort(hb.Relayed)
	if len(hb.Relayed) > store.MaxRelayedListed {
		hb.Relayed = hb.Relayed[:store.MaxRelayedListed]
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.PutMeshBeat(hctx, hb); err != nil {
		n.met.heartbeats.WithLabelValues("error").Inc()
		n.log.Debug("heartbeat", zap.Error(err))
		return
	}
	n.met.heartbeats.WithLabelValues("ok").Inc()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
