package fleet

// The machine liveness judgement: the beats as the aggregator heard them,
// which machines they make stale or offline, and the record gateways set
// those machines' instances aside by.

import (
	"context"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// beat takes in a machine's beat. For the liveness judgement its time is
// when the aggregator heard it (live), or when the store stored it (the
// watch's initial values): one clock for every machine, so that a
// machine's own, off by any amount, never makes it look silent or alive
// to the gateways.
func (a *Aggregator) beat(ent jetstream.KeyValueEntry, live bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	var b store.MachineBeat
	if ent.Operation() != jetstream.KeyValuePut || store.DecodeKeyed(a.s.Names.MachineBeatsBucket(), ent.Key(), ent.Value(), &b) != nil {
		delete(a.beats, ent.Key())
		delete(a.heard, ent.Key())
	} else {
		a.beats[b.Machine] = b
		a.heard[b.Machine] = now
		if !live && ent.Created().Before(now) {
			a.heard[b.Machine] = ent.Created()
		}
	}
	a.machineChanged(ent.Key(), now)
}

// judge writes the fleet's liveness judgement (store.LivenessRecord): the
// machines that missed store.MeshUnreachableAfter beats or more at now,
// when that set or a machine's state in it changed, and every
// store.LivenessRefresh.
func (a *Aggregator) judge(ctx context.Context, now time.Time) error {
	a.mu.Lock()
	down := map[string]store.MachineDown{}
	for m, b := range a.beats {
		heard := &store.MachineBeat{At: a.heard[m], Interval: b.Interval}
		l := heard.Liveness(now)
		if !isStale(l) {
			continue
		}
		iv := time.Duration(b.Interval)
		if iv <= 0 {
			iv = store.DefaultBeatInterval
		}
		down[m] = store.MachineDown{Liveness: l, LastBeat: heard.At, Interval: iv}
	}
	same := maps.EqualFunc(a.judged, down, func(x, y store.MachineDown) bool { return x.Liveness == y.Liveness })
	due := a.judged == nil || !same || now.Sub(a.judgedAt) >= store.LivenessRefresh
	a.mu.Unlock()
	if !due {
		return nil
	}
	if err := a.s.PutLiveness(ctx, &store.LivenessRecord{At: now.UTC(), Judge: store.HostName("control"), Down: down}); err != nil {
		return err
	}
	a.mu.Lock()
	a.judged, a.judgedAt = down, now
	a.mu.Unlock()
	return nil
}

// ageBeats notices machines whose liveness changed with time alone.
func (a *Aggregator) ageBeats() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for m := range a.beats {
		a.machineChanged(m, now)
	}
}

// machineChanged marks the namespaces with instances on m dirty if m's
// liveness changed; a.mu is held.
func (a *Aggregator) machineChanged(m string, now time.Time) {
	l := liveness(a.beats, m, now)
	if a.live[m] == l {
		return
	}
	a.live[m] = l
	for ns := range a.onMachine[m] {
		a.touch(ns, now)
	}
}

func liveness(beats map[string]store.MachineBeat, m string, now time.Time) string {
	if b, ok := beats[m]; ok {
		return b.Liveness(now)
	}
	return store.MachineNeverSeen
}

// isStale says whether instances on a machine of liveness l count as
// stale; a machine that never beat (an older agent) is taken at its
// records' word.
func isStale(l string) bool { return l == store.MachineStale || l == store.MachineOffline }
