package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
)

// Healing. An instance that ends without being asked to is out of the
// routing at once; its restart policy decides what follows. Restarted, it
// keeps its identity (ID, slot, address and port: what the live commit
// routes to) and rejoins the routing only once its readiness check passes
// again. Waits between restarts grow from RestartBackoff, doubling per
// failure in a row, up to RestartBackoffMax, with ±20% jitter so a fleet
// of crash-looping instances does not restart in step.

// wantsRestart applies a restart policy to how a run ended.
func wantsRestart(policy string, why error) bool {
	switch policy {
	case store.RestartAlways:
		return true
	case store.RestartOnFailure:
		return !runtime.Clean(why)
	}
	return false
}

// backoffDelay is the wait before restart number failures (1-based).
func backoffDelay(base, ceiling time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(d))
	return max(d+jitter, time.Millisecond)
}

// watch handles the end of the instance's current run that the agent did
// not ask for: it leaves the routing at once (republish) and, as its
// restart policy says, is restarted after a backoff or recorded failed.
func (a *Agent) watch(inst *instance) {
	var h runtime.Handle
	a.locked(func() { h = inst.handle })
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-h.Exited():
		case <-a.quit:
			return
		}
		act, why := a.ended(inst, h)
		switch act {
		case endRestart:
			a.backoff(inst, why)
		case endFail:
			a.forget(inst.id)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a.markFailed(ctx, inst, why.Error())
		}
	}()
}

// What follows the end of an instance's run.
const (
	endNothing = iota // it was stopped, or this run is no longer its current one
	endRestart
	endFail
)

// ended decides what follows the end of inst's run h, and why it ended;
// an instance that fails for good is forgotten here.
func (a *Agent) ended(inst *instance, h runtime.Handle) (act int, why error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	current := a.instances[inst.id] == inst && inst.handle == h
	if inst.stopping || !current {
		return endNothing, nil
	}
	why = h.ExitErr()
	if inst.notReady != "" {
		why, inst.notReady = errors.New(inst.notReady), ""
	}
	if wantsRestart(inst.Spec.RestartPolicy(), why) {
		return endRestart, why
	}
	inst.gone = true
	delete(a.instances, inst.id)
	return endFail, why
}

// backoff records that inst's run ended (why), takes it out of the routing
// and schedules its restart.
func (a *Agent) backoff(inst *instance, why error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rec store.InstanceRecord
	var delay time.Duration
	if !a.change(inst, func() {
		var failures int
		rec, failures, delay = a.noteFailure(inst, why)
		if err := a.persist(inst); err != nil {
			a.log.Error("persisting instance backoff", zap.String("instance", rec.ID), zap.Error(err))
		}
		a.log.Warn("instance ended; restarting after backoff", zap.String("instance", rec.ID), zap.String("exit", rec.LastExit),
			zap.Int("failures_in_a_row", failures), zap.Duration("backoff", delay))
		if err := a.flushObserved(ctx, rec); err != nil {
			a.log.Error("recording instance backoff (written again later)", zap.String("instance", rec.ID), zap.Error(err))
		}
	}) {
		return // stopped meanwhile
	}
	if err := a.requestRepublish(ctx, rec.Namespace, rec.Service); err != nil {
		a.log.Error("republishing routing after an instance ended", zap.String("instance", rec.ID), zap.Error(err))
	}
	a.scheduleRestart(inst, delay)
}

// noteFailure counts one more failure in a row of inst and records it in
// backoff until now+delay.
func (a *Agent) noteFailure(inst *instance, why error) (rec store.InstanceRecord, failures int, delay time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !inst.readySince.IsZero() && time.Since(inst.readySince) >= a.cfg.RestartBackoffMax {
		inst.Failures = 0 // it had been healthy for long: start over
	}
	inst.Failures++
	delay = backoffDelay(a.cfg.RestartBackoff, a.cfg.RestartBackoffMax, inst.Failures)
	now := time.Now().UTC()
	rec = inst.Record
	rec.State, rec.UpdatedAt = store.InstanceBackoff, now
	rec.LastExit, rec.LastExitAt, rec.NextRestart = why.Error(), now, now.Add(delay)
	rec.Error = fmt.Sprintf("%s; restart %d in %s", why, rec.Restarts+1, delay.Round(time.Millisecond))
	inst.Record, inst.readySince = rec, time.Time{}
	return rec, inst.Failures, delay
}

// scheduleRestart restarts inst after delay unless it is stopped first or
// the agent ends (the persisted backoff is resumed by the next agent).
func (a *Agent) scheduleRestart(inst *instance, delay time.Duration) {
	cancel := make(chan struct{})
	scheduled := false
	a.locked(func() {
		if !inst.stopping {
			inst.healCancel, scheduled = cancel, true
		}
	})
	if !scheduled {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		t := time.NewTimer(max(delay, 0))
		defer t.Stop()
		select {
		case <-t.C:
		case <-cancel:
			return
		case <-a.quit:
			return
		}
		a.restart(inst)
	}()
}

// restart starts inst again in place and waits for its readiness; a start
// or readiness failure is one more failure in a row.
func (a *Agent) restart(inst *instance) {
	rec, ok := a.takeRestart(inst)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := a.launch(ctx, rec, inst.Spec, rec.Port)
	if err != nil {
		a.backoff(inst, fmt.Errorf("restart failed: %w", err))
		return
	}
	ok = false
	a.change(inst, func() {
		if rec, ok = a.restarted(inst, h); !ok {
			return
		}
		if err := a.persist(inst); err != nil {
			a.log.Error("persisting restarted instance", zap.String("instance", rec.ID), zap.Error(err))
		}
		if err := a.flushObserved(ctx, rec); err != nil {
			a.log.Error("recording restarted instance (written again later)", zap.String("instance", rec.ID), zap.Error(err))
		}
	})
	if !ok {
		// Stopped while starting: this run is not wanted either.
		_ = a.driverOf(h).Stop(ctx, h, a.cfg.StopGrace)
		return
	}
	a.restarts.Add(1)
	a.watch(inst)
	a.log.Info("restarted instance", zap.String("instance", rec.ID), zap.Int("restarts", rec.Restarts), zap.Int("pid", rec.PID))
	rr, err := a.awaitReady(ctx, inst, 0)
	switch {
	case err != nil:
		a.log.Error("recording restarted instance ready", zap.String("instance", rec.ID), zap.Error(err))
	case !rr.Ready:
		// Its watcher sees the end of this run and backs off again: the
		// run already ended (its own exit says why), or it still runs
		// unready and is ended here.
		select {
		case <-h.Exited():
			return
		default:
		}
		if a.endUnready(inst, "restarted but "+rr.Error) {
			_ = a.driverOf(h).Stop(ctx, h, a.cfg.StopGrace)
		}
		return
	}
	if err := a.requestRepublish(ctx, rec.Namespace, rec.Service); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("republishing routing after a restart", zap.String("instance", rec.ID), zap.Error(err))
	}
}

// takeRestart claims inst's scheduled restart: false when it was stopped
// or replaced meanwhile.
func (a *Agent) takeRestart(inst *instance) (store.InstanceRecord, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst.stopping || a.instances[inst.id] != inst {
		return store.InstanceRecord{}, false
	}
	inst.healCancel = nil
	return inst.Record, true
}

// restarted makes h inst's current run, recorded starting: false when inst
// was stopped while h started.
func (a *Agent) restarted(inst *instance, h runtime.Handle) (store.InstanceRecord, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst.stopping {
		return store.InstanceRecord{}, false
	}
	rec := inst.Record
	rec.Restarts++
	rec.State, rec.Error, rec.PID, rec.NextRestart, rec.UpdatedAt = store.InstanceStarting, "", h.State().PID, time.Time{}, time.Now().UTC()
	rec.Container = h.State().Container
	inst.handle, inst.Runtime, inst.Record = h, h.State(), rec
	return rec, true
}

// endUnready notes why the agent is about to end inst's unready run (its
// watcher reports that instead of the exit the stop causes); false when
// inst is being stopped anyway.
func (a *Agent) endUnready(inst *instance, why string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst.stopping {
		return false
	}
	inst.notReady = why
	return true
}
