package node

import (
	"context"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// pskRetryUnknown is how long a peer the registrar gave no key for (a
// static peer, or one not yet registered everywhere) is not asked for
// again, unless its peer record changes meanwhile.
const pskRetryUnknown = time.Minute

// pskUnknown is a peer the registrar gave no key for: when, and the peer
// record this node held then.
type pskUnknown struct {
	at  time.Time
	rec store.MeshPeerRecord
}

// pskLoop keeps the preshared keys of this node's pairs: it asks the
// registrar, on its own machine's subject and with its node secret, for the
// keys of the peers it holds none for, when the peers change and every
// reconcile interval. A pair uses its key once both peer records say their
// nodes use keys (see computeDesired); until this node holds the key, the
// pair's handshakes fail and WireGuard retries them.
func (n *Node) pskLoop(ctx context.Context) {
	unknown := map[string]pskUnknown{}
	repeat(ctx, n.cfg.ReconcileInterval, n.pskKick, func() { n.fetchPSKs(ctx, unknown) })
}

func (n *Node) fetchPSKs(ctx context.Context, unknown map[string]pskUnknown) {
	s := n.storeP.Load()
	if s == nil || !s.NC.IsConnected() {
		return
	}
	now := time.Now()
	n.mu.Lock()
	if !usesPSK(n.peers[n.st.Machine]) {
		// Joined before preshared keys: its pairs use none.
		n.mu.Unlock()
		return
	}
	var want []string
	asked := map[string]store.MeshPeerRecord{}
	for m, rec := range n.peers {
		_, have := n.psks[m]
		if m == n.st.Machine || !usesPSK(rec) || have {
			continue
		}
		// A peer registering everywhere rewrites its record: ask again.
		if u, ok := unknown[m]; ok && now.Sub(u.at) < pskRetryUnknown && reflect.DeepEqual(u.rec, rec) {
			continue
		}
		want = append(want, m)
		asked[m] = rec
	}
	// Keys of machines that left go with them.
	for m := range n.psks {
		if _, ok := n.peers[m]; !ok {
			delete(n.psks, m)
		}
	}
	for m := range unknown {
		if _, ok := n.peers[m]; !ok {
			delete(unknown, m)
		}
	}
	ready := n.pskReady
	n.mu.Unlock()
	if ready && len(want) == 0 {
		return
	}
	got := map[string]Key{}
	for len(want) > 0 || !ready {
		chunk := want[:min(len(want), store.MaxPSKPeers)]
		want = want[len(chunk):]
		req := store.MeshPSKRequest{Version: store.RecordVersion, Machine: n.st.Machine, Secret: n.st.Secret, Peers: chunk}
		var rep store.MeshPSKReply
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := store.Call(cctx, s.NC, s.Names.RegistrarSubject("psk."+n.st.Machine), "registrar", "psk", req, &rep)
		cancel()
		if err != nil {
			n.notePSKError(err)
			return
		}
		for _, m := range chunk {
			k, err := ParseKey(rep.PSKs[m])
			if err != nil {
				unknown[m] = pskUnknown{at: now, rec: asked[m]}
				continue
			}
			got[m] = k
		}
		ready = true
	}
	n.mu.Lock()
	first := !n.pskReady
	n.pskReady, n.pskErr = true, ""
	for m, k := range got {
		n.psks[m] = k
	}
	n.mu.Unlock()
	n.saveCache()
	if first {
		n.log.Info("holding the pairs' preshared keys", zap.Int("peers", len(got)))
	}
	n.requestApply()
}

func (n *Node) notePSKError(err error) {
	msg := err.Error()
	if store.HasCode(err, store.CodeUnavailable) {
		msg += " (no registrar answered: is `control server` running, and were this machine's mesh credentials issued by a version that knows preshared keys?)"
	}
	n.mu.Lock()
	changed := n.pskErr != msg
	n.pskErr = msg
	n.mu.Unlock()
	if changed {
		n.log.Warn("asking for the pairs' preshared keys", zap.String("error", msg))
	}
}
