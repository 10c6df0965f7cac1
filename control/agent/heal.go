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

// backoff records that inst's run ended (why), takes it out of the routing
// and schedules its restart.
func (a *Agent) backoff(inst *instance, why error) {
	a.mu.Lock()
	if !inst.readySince.IsZero() && time.Since(inst.readySince) >= a.cfg.RestartBackoffMax {
		inst.Failures = 0 // it had been healthy for long: start over
	}
	inst.Failures++
	delay := backoffDelay(a.cfg.RestartBackoff, a.cfg.RestartBackoffMax, inst.Failures)
	now := time.Now().UTC()
	rec := inst.Record
	rec.State, rec.UpdatedAt = store.InstanceBackoff, now
	rec.LastExit, rec.LastExitAt, rec.NextRestart = why.Error(), now, now.Add(delay)
	rec.Error = fmt.Sprintf("%s; restart %d in %s", why, rec.Restarts+1, delay.Round(time.Millisecond))
	inst.Record, inst.readySince = rec, time.Time{}
	failures := inst.Failures
	a.mu.Unlock()
	if err := a.persist(inst); err != nil {
		a.log.Error("persisting instance backoff", zap.String("instance", rec.ID), zap.Error(err))
	}
	a.log.Warn("instance ended; restarting after backoff", zap.String("instance", rec.ID), zap.String("exit", rec.LastExit),
		zap.Int("failures_in_a_row", failures), zap.Duration("backoff", delay))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.writeRecord(ctx, &rec); err != nil {
		a.log.Error("recording instance backoff", zap.String("instance", rec.ID), zap.Error(err))
	}
	if err := a.republish(ctx, rec.Namespace, rec.Service); err != nil {
		a.log.Error("republishing routing after an instance ended", zap.String("instance", rec.ID), zap.Error(err))
	}
	a.scheduleRestart(inst, delay)
}

// scheduleRestart restarts inst after delay unless it is stopped first or
// the agent ends (the persisted backoff is resumed by the next agent).
func (a *Agent) scheduleRestart(inst *instance, delay time.Duration) {
	cancel := make(chan struct{})
	a.mu.Lock()
	if inst.stopping {
		a.mu.Unlock()
		return
	}
	inst.healCancel = cancel
	a.mu.Unlock()
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
	a.mu.Lock()
	if inst.stopping || a.instances[inst.Record.ID] != inst {
		a.mu.Unlock()
		return
	}
	inst.healCancel = nil
	rec, spec := inst.Record, inst.Spec
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := a.launch(ctx, rec, spec, rec.Port)
	if err != nil {
		a.backoff(inst, fmt.Errorf("restart failed: %w", err))
		return
	}
	now := time.Now().UTC()
	a.mu.Lock()
	if inst.stopping {
		// Stopped while starting: this run is not wanted either.
		a.mu.Unlock()
		_ = a.driverOf(h).Stop(ctx, h, a.cfg.StopGrace)
		return
	}
	rec = inst.Record
	rec.Restarts++
	rec.State, rec.Error, rec.PID, rec.NextRestart, rec.UpdatedAt = store.InstanceStarting, "", h.State().PID, time.Time{}, now
	rec.Container = h.State().Container
	inst.handle, inst.Runtime, inst.Record = h, h.State(), rec
	a.mu.Unlock()
	if err := a.persist(inst); err != nil {
		a.log.Error("persisting restarted instance", zap.String("instance", rec.ID), zap.Error(err))
	}
	if err := a.writeRecord(ctx, &rec); err != nil {
		a.log.Error("recording restarted instance", zap.String("instance", rec.ID), zap.Error(err))
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
		a.mu.Lock()
		stopping := inst.stopping
		if !stopping {
			inst.notReady = "restarted but " + rr.Error
		}
		a.mu.Unlock()
		if !stopping {
			_ = a.driverOf(h).Stop(ctx, h, a.cfg.StopGrace)
		}
		return
	}
	if err := a.republish(ctx, rec.Namespace, rec.Service); err != nil && !errors.Is(err, context.Canceled) {
		a.log.Error("republishing routing after a restart", zap.String("instance", rec.ID), zap.Error(err))
	}
}
