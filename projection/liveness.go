package projection

import (
	"context"
	"maps"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Machine liveness as this process observes it. Agents beat into the
// machine heartbeats bucket, which republishes each beat; the projection
// notes when it received each machine's last beat, by its own clock, and
// judges from that, when it decides, whether the machine went quiet. The
// judgement is never stored: instance records and routing state are
// untouched, and a machine that beats again is served again at once. A
// view carries the machines judged down when it was swapped in, so the
// upstream source and the DNS zone set their instances aside (and serve
// them anyway when a service has no other: fail open).

// MachineDown is why a machine's instances are set aside.
type MachineDown struct {
	// Liveness is store.MachineStale or store.MachineOffline.
	Liveness string `json:"liveness"`
	// LastBeat is when this process received the machine's last beat (or
	// when the store stored it, for a beat read at load).
	LastBeat time.Time `json:"last_beat"`
	// Interval is the beat interval the machine announced.
	Interval time.Duration `json:"interval"`
}

// livenessCheck is how often the projection judges liveness again.
const livenessCheck = 250 * time.Millisecond

// beatSeen is the last beat received from one machine.
type beatSeen struct {
	at       time.Time
	interval time.Duration
}

// liveness holds the last beat of each machine; owned by the session
// goroutine, read by the Status reporter.
type liveness struct {
	mu    sync.Mutex
	beats map[string]beatSeen
}

// observe notes a beat of b.Machine received at at (never later than now:
// a stored time from a clock ahead of ours counts as now).
func (l *liveness) observe(b *store.MachineBeat, at time.Time) {
	iv := time.Duration(b.Interval)
	if iv <= 0 {
		iv = store.DefaultBeatInterval
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.beats == nil {
		l.beats = map[string]beatSeen{}
	}
	if now := time.Now(); at.After(now) {
		at = now
	}
	if prev, ok := l.beats[b.Machine]; ok && prev.at.After(at) {
		return
	}
	l.beats[b.Machine] = beatSeen{at: at, interval: iv}
}

// rebase gives every machine a fresh start at now: after this process
// could not hear beats (its own connection was down), silence says
// nothing about the machines.
func (l *liveness) rebase(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for m, b := range l.beats {
		if b.at.Before(now) {
			b.at = now
			l.beats[m] = b
		}
	}
}

// down judges every machine at now: those that missed
// store.MeshUnreachableAfter beats or more. A machine never heard from is
// not judged.
func (l *liveness) down(now time.Time) map[string]MachineDown {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out map[string]MachineDown
	for m, b := range l.beats {
		state := (&store.MachineBeat{At: b.at, Interval: store.Duration(b.interval)}).Liveness(now)
		if state != store.MachineStale && state != store.MachineOffline {
			continue
		}
		if out == nil {
			out = map[string]MachineDown{}
		}
		out[m] = MachineDown{Liveness: state, LastBeat: b.at, Interval: b.interval}
	}
	return out
}

// loadBeats reads every machine's last stored beat.
func (p *Projection) loadBeats(ctx context.Context, st *store.Store) error {
	entries, err := st.ScanKV(ctx, st.MachineBeats, ">")
	if err != nil {
		return err
	}
	for _, e := range entries {
		var b store.MachineBeat
		if err := store.DecodeKeyed(st.MachineBeats.Bucket(), e.Key, e.Value, &b); err != nil {
			p.log.Warn("skipping a heartbeat record", zap.Error(err))
			continue
		}
		p.live.observe(&b, e.Created)
	}
	return nil
}

// beat notes a republished beat, received now.
func (p *Projection) beat(st *store.Store, sm *store.StoredMsg) {
	b, err := st.MachineBeatFromMsg(sm)
	if err != nil {
		p.log.Warn("skipping a heartbeat", zap.Error(err))
		return
	}
	p.live.observe(b, time.Now())
}

// judgeLiveness swaps in a view with the machines judged down now, when
// that changed, and logs each change.
func (p *Projection) judgeLiveness() {
	p.setDown(p.live.down(time.Now()))
}

// setDown makes down the machines judged down, for this view and every
// view after it.
func (p *Projection) setDown(down map[string]MachineDown) {
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
	p.swap(old)
}

// sameDown compares two judgements by machine and liveness.
func sameDown(a, b map[string]MachineDown) bool {
	return maps.EqualFunc(a, b, func(x, y MachineDown) bool { return x.Liveness == y.Liveness })
}
