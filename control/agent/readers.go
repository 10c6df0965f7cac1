package agent

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Whether every reader reads observations. The agent writes an instance's
// ready, backoff and draining in its machine's observation record
// (observedwriter.go), which readers of schema generation 1 (control
// servers and CLIs before 7fdb3aa) never read: to them the instance would
// stay "starting", out of routing. So until the agent knows that no such
// reader is left it also writes those states into the instance record, as
// releases of generation 1 did (one write per instance and change).
//
// It knows from the store's floor alone. A control server announces itself
// (store.ServerRecord), but one of a release before announcements writes
// nothing a reader could tell it by: no record, or an expired one, proves
// nothing, and an agent cannot list the store's connections. The floor is
// raised by the control plane only when every process it hears from is at
// the generation (control/controlplane's announce.go), and a process below
// the floor refuses to start: a floor at store.GenerationObserved or above
// is the control plane's word that observations are read by every reader.
// A floor only rises, so once seen the agent stops looking. A floor it
// cannot read (credentials issued before the floor existed may not read
// it) is taken as generation 1: the safe side, at the cost of the second
// write.

// readersObserve says whether every reader takes instance states from the
// observation record (the floor says so).
func (a *Agent) readersObserve() bool { return a.observedOnly.Load() }

// checkFloor reads the store's floor: a floor above this agent's generation
// is a too_old error (the agent refuses to run); one at
// store.GenerationObserved or above lets it write observations only.
func (a *Agent) checkFloor(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, floorRead)
	defer cancel()
	f, _, err := a.cfg.Store.Floor(rctx)
	if err != nil {
		return err
	}
	release, gen := store.Announcement()
	if err := store.TooOld(f, "agent", gen, release); err != nil {
		return err
	}
	if f.MinGeneration >= store.GenerationObserved && !a.observedOnly.Swap(true) {
		a.log.Info("every reader reads instance observations: instance states go to the observation record only",
			zap.Int("floor", f.MinGeneration), zap.String("set_by", f.SetBy))
	}
	return nil
}

// floorRead bounds one read of the floor: with credentials that may not
// read it, the read is never answered.
const floorRead = 3 * time.Second

// watchFloor reads the floor every BeatInterval until it lets the agent
// write observations only, or ctx ends.
func (a *Agent) watchFloor(ctx context.Context) {
	t := time.NewTicker(a.cfg.BeatInterval)
	defer t.Stop()
	for !a.readersObserve() {
		select {
		case <-ctx.Done():
			return
		case <-a.quit:
			return
		case <-t.C:
		}
		if err := a.checkFloor(ctx); err != nil && ctx.Err() == nil {
			a.log.Debug("reading the store's floor (instance states still written to instance records too)", zap.Error(err))
		}
	}
}

// writeForOldReaders writes rec, a state change just written to the
// observation record, into the instance record too, unless every reader
// reads observations.
func (a *Agent) writeForOldReaders(ctx context.Context, rec *store.InstanceRecord) error {
	if a.readersObserve() {
		return nil
	}
	_, err := a.cfg.Store.PutInstance(ctx, rec)
	return err
}
