package projection

import (
	"context"
	"maps"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Machine liveness as the control plane judges it. Agents beat into the
// machine heartbeats bucket; the control server's aggregator follows the
// beats and writes one record listing the machines that stopped beating
// (store.LivenessRecord), which the liveness bucket republishes. The
// projection follows that record, not the beats: a storage node sends it
// one message per change instead of every machine's every beat. The
// judgement never touches instance records or routing state, and a machine
// that beats again is served again with the next record. A view carries
// the machines judged down when it was swapped in, so the upstream source
// and the DNS zone set their instances aside (and serve them anyway when a
// service has no other: fail open). A record older than
// store.LivenessExpiry (the judge is away) sets nothing aside.

// MachineDown is why a machine's instances are set aside.
type MachineDown = store.MachineDown

// livenessCheck is how often the projection looks whether its judgement
// expired.
const livenessCheck = 250 * time.Millisecond

// loadLiveness reads the latest judgement.
func (p *Projection) loadLiveness(ctx context.Context, st *store.Store) error {
	r, err := st.Liveness(ctx)
	if err != nil {
		return err
	}
	p.noteLiveness(r)
	return nil
}

// liveness takes a republished judgement.
func (p *Projection) liveness(st *store.Store, sm *store.StoredMsg) {
	r, err := st.LivenessFromMsg(sm)
	if err != nil {
		p.log.Warn("skipping a machine liveness record", zap.Error(err))
		return
	}
	p.noteLiveness(r)
}

// noteLiveness keeps r, unless it is older than the judgement held.
func (p *Projection) noteLiveness(r *store.LivenessRecord) {
	if r == nil || p.judged != nil && r.At.Before(p.judged.At) {
		return
	}
	p.judged = r
	p.judgeLiveness()
}

// judgeLiveness swaps in a view with the machines judged down now, when
// that changed, and logs each change.
func (p *Projection) judgeLiveness() {
	if !p.judged.Fresh(time.Now()) {
		p.setDown(nil)
		return
	}
	p.setDown(p.judged.Down)
}

// setDown makes down the machines judged down, for this view and every
// view after it.
func (p *Projection) setDown(down map[string]MachineDown) {
	p.swapMu.Lock()
	defer p.swapMu.Unlock()
	old := p.View()
	if sameDown(old.down, down) {
		return
	}
	for m, d := range down {
		if _, was := old.down[m]; !was {
			p.log.Warn("machine stopped beating; its instances get no new requests while others serve",
				zap.String("machine", m), zap.String("liveness", d.Liveness), zap.Time("last_beat", d.LastBeat))
		}
	}
	for m := range old.down {
		if _, still := down[m]; !still {
			p.log.Info("machine beats again; its instances are served", zap.String("machine", m))
		}
	}
	p.downNow.Store(&down)
	p.install(old)
}

// sameDown compares two judgements by machine and liveness.
func sameDown(a, b map[string]MachineDown) bool {
	return maps.EqualFunc(a, b, func(x, y MachineDown) bool { return x.Liveness == y.Liveness })
}
