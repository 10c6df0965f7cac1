package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Key rotation, the node's half (the peers' half is in computeDesired).
//
// A rotation is asked for in the node's own peer record (RotateRequested,
// written by `control mesh rotate`). The node then:
//
//  1. creates its next key in nextKeyFile, or reuses the one there, so a
//     retry after a lost reply registers the same key again;
//  2. asks the registrar, on its own subject and with its node secret, to
//     register the key; the record now names the old key PreviousKey,
//     which peers keep accepting until PreviousUntil;
//  3. once its own record, verified, carries the new key, waits
//     RotatePrepare after KeySince so peers have added the new key, then
//     switches the device to it and shakes hands with every peer.
//
// Peers move the node's mesh IP to the new key when a handshake under it
// completes, and drop the old key when the overlap ends.

// Defaults of rotation.
const (
	DefaultRotatePrepare = 3 * time.Second
	// rotateFastPoll is how often a node looks at its device while a
	// peer's new key has not shaken hands yet: the mesh IP moves to the
	// new key on the first reconcile after the handshake, and every
	// packet between the two is dropped.
	rotateFastPoll = 100 * time.Millisecond
	// rotateBurst looks, rotateBurstPoll apart, follow a handshake
	// initiation during a rotation: the peer's data follows the
	// initiation by one round trip.
	rotateBurst     = 20
	rotateBurstPoll = 500 * time.Microsecond
	// rotateFastWindow bounds the fast polling after a peer's KeySince: a
	// peer that does not switch within it is looked at on the usual
	// interval (its old key keeps working until the overlap ends).
	rotateFastWindow = time.Minute
)

func (n *Node) requestRotate() {
	select {
	case n.rotateKick <- struct{}{}:
	default:
	}
}

// rotateLoop carries out rotations asked for in this node's peer record.
func (n *Node) rotateLoop(ctx context.Context) {
	repeat(ctx, n.cfg.ReconcileInterval, n.rotateKick, func() {
		if err := n.rotateStep(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("key rotation", zap.Error(err))
			n.met.rotateErrors.Inc()
		}
	})
}

// rotateStep does what the node's own record asks for now: register a new
// key, or switch to the one registered.
func (n *Node) rotateStep(ctx context.Context) error {
	n.mu.Lock()
	self, ok := n.peers[n.st.Machine]
	current := n.key.Public().String()
	n.mu.Unlock()
	if !ok || self.Static {
		return nil
	}
	next, found, err := loadKey(n.cfg.DataDir, nextKeyFile)
	if err != nil {
		return err
	}
	switch {
	case found && self.PublicKey == next.Public().String():
		return n.switchKey(ctx, next, self.KeyAge())
	case self.PublicKey == current && self.RotationDue():
		return n.registerNextKey(ctx)
	}
	return nil
}

// registerNextKey asks the registrar to register the next key. The switch
// follows when the record comes back through the watch.
func (n *Node) registerNextKey(ctx context.Context) error {
	s := n.storeP.Load()
	if s == nil || !s.NC.IsConnected() {
		return nil // asked again once connected
	}
	next, err := loadOrCreateKey(n.cfg.DataDir, nextKeyFile)
	if err != nil {
		return err
	}
	req := store.MeshRotateRequest{Version: store.RecordVersion, Machine: n.st.Machine, Secret: n.st.Secret,
		PublicKey: next.Public().String(), Overlap: store.Duration(n.cfg.KeyOverlap)}
	var rep store.MeshRotateReply
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := store.Call(cctx, s.NC, s.Names.RegistrarSubject("rotate."+n.st.Machine), "registrar", "rotate", req, &rep); err != nil {
		if store.HasCode(err, store.CodeUnavailable) {
			err = fmt.Errorf("%w (no registrar answered: is `control server` running, and were this machine's mesh credentials issued by a version that rotates keys?)", err)
		}
		return fmt.Errorf("registering the next key: %w", err)
	}
	n.log.Info("next key registered; switching once peers have it", zap.String("public_key", req.PublicKey),
		zap.Duration("prepare", n.cfg.RotatePrepare))
	return nil
}

// switchKey moves the device to next, registered at since, once peers have
// had RotatePrepare to add it.
func (n *Node) switchKey(ctx context.Context, next Key, since time.Time) error {
	if wait := time.Until(since.Add(n.cfg.RotatePrepare)); wait > 0 && !sleepCtx(ctx, wait) {
		return ctx.Err()
	}
	if err := n.dev.dev.IpcSet(fmt.Sprintf("private_key=%s\n", next.Hex())); err != nil {
		return fmt.Errorf("switching the device to the next key: %w", err)
	}
	// From here the device runs on next: the data dir must say so before
	// anything else can fail.
	if err := saveKey(n.cfg.DataDir, keyFile, next); err != nil {
		return fmt.Errorf("device switched to the next key but saving it failed (it is still in %s): %w", nextKeyFile, err)
	}
	if err := os.Remove(filepath.Join(n.cfg.DataDir, nextKeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n.mu.Lock()
	n.key = next
	n.mu.Unlock()
	// Sessions under the old key ended with it: a keepalive now finds no
	// session and shakes hands, rather than at the next packet, so peers
	// move the mesh IP to the new key at once.
	peers, err := n.dev.peers()
	if err != nil {
		return err
	}
	n.keepaliveNow(slices.Collect(maps.Keys(peers)))
	n.met.rotations.Inc()
	n.log.Info("switched to the next key", zap.String("public_key", next.Public().String()))
	return nil
}

// adoptNextKey finishes a rotation a restart interrupted: the registrar
// already took the next key (the cached own record names it), so the device
// must start on it.
func adoptNextKey(dir string, key Key, self store.MeshPeerRecord) (Key, error) {
	next, found, err := loadKey(dir, nextKeyFile)
	if err != nil || !found || self.PublicKey != next.Public().String() {
		return key, err
	}
	if err := saveKey(dir, keyFile, next); err != nil {
		return key, err
	}
	return next, os.Remove(filepath.Join(dir, nextKeyFile))
}

// awaitSwitch is the device's initiation hook, run on the receive path
// before WireGuard sees pkt. A handshake initiation under a rotating peer's
// new key means the peer has switched, and its data follows WireGuard's
// answer by one round trip. Moved any later (polling the device for the
// handshake, as reconcileLoop does), that data meets a key the mesh IP is
// not on and WireGuard drops it; moved at once, the old key's last packets,
// read with the initiation or still being decrypted, are dropped instead.
// A TCP stream that loses a window at once over netstack recovers a segment
// or two per retransmission timeout and stalls for seconds
// (TestKeyRotationKeepsTunnels under load). So the move runs between the
// two: after this read (see wgbind.Demux.OnInitiation) and the old key's
// packets, before the next read.
func (n *Node) awaitSwitch(ctx context.Context, pkt []byte) (then func()) {
	n.mu.Lock()
	awaiting, priv := n.awaiting, n.key
	n.mu.Unlock()
	from, ok := Key{}, false
	if len(awaiting) > 0 {
		from, ok = initiator(pkt, priv, awaiting)
	}
	if !ok {
		// Another peer's, or one meshd could not place (it is not in
		// the device yet): reconcileLoop looks at the device.
		select {
		case n.initiations <- struct{}{}:
		default:
		}
		return nil
	}
	return func() {
		n.devMu.RLock()
		defer n.devMu.RUnlock()
		if n.devClosing {
			return
		}
		n.drained(awaiting[from])
		n.mu.Lock()
		n.switched[from] = true
		n.mu.Unlock()
		n.reconcile(ctx, false)
	}
}

// drained waits, briefly, until the old key's packets read so far have been
// through WireGuard: it checks their source against the mesh IP only after
// decrypting them. The receive path is held meanwhile (the caller runs on
// it), so nothing new joins them.
func (n *Node) drained(old Key) {
	const step, most = time.Millisecond, 20 * time.Millisecond
	last := uint64(0)
	for waited := time.Duration(0); waited < most; waited += step {
		peers, err := n.dev.peers()
		p := peers[old]
		if err != nil || p == nil || (waited > 0 && p.RxBytes == last) {
			return
		}
		last = p.RxBytes
		time.Sleep(step)
	}
}
