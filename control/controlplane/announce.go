package controlplane

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// A control server announces what it is (store.ServerRecord: release and
// schema generation) at start and every announceEvery, and raises the
// store's floor to what this release's writers need of every reader once
// every process it hears from is at that generation.
//
// What this release's writers need: an agent writes an instance's ready,
// backoff and draining in its machine's observation record only, which
// readers of generation 1 do not read (store.GenerationObserved). Until
// the floor says generation 2, agents write those states into the
// instance records too (control/agent's readers.go); the floor is how
// they learn that they may stop.
//
// Why the floor and not the announcements themselves: a process of a
// release before announcements writes none, so the absence of an old
// announcement proves nothing. The floor is different: a process checks
// it at start and refuses to run below it. Raising it is the control
// plane saying "from now on no reader below this runs here", which agents
// can rely on. What the raise cannot see is a control server (or CLI) of a
// release before announcements that is still running: it announces
// nothing and checks no floor. Agents, gateways and meshd of v0.38.0 are
// seen (their heartbeats and reports); a v0.38.0 control server reads
// observations already (generation 2) and is no risk; a server before
// v0.38.0 is what the skew policy (one minor release at a time, the
// control plane first, which `control fleet upgrade` enforces) keeps out
// of a fleet of this release.

// announceEvery is how often a control server announces itself again (a
// record three times older is taken as a server that stopped).
const announceEvery = 10 * time.Second

// announce announces control server name and keeps the floor raised
// until ctx ends.
func announce(ctx context.Context, s *store.Store, name string, log *zap.Logger) {
	started := time.Now().UTC()
	tick := time.NewTicker(announceEvery)
	defer tick.Stop()
	for {
		wctx, cancel := context.WithTimeout(ctx, announceEvery)
		if err := s.PutServerRecord(wctx, name, started, announceEvery); err != nil && ctx.Err() == nil {
			log.Warn("announcing this control server (retried)", zap.Error(err))
		}
		if err := raiseFloor(wctx, s, name, log); err != nil && ctx.Err() == nil {
			log.Warn("raising the store's floor (retried)", zap.Error(err))
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// raiseFloor raises the floor to store.GenerationObserved when every
// process heard from is at it.
func raiseFloor(ctx context.Context, s *store.Store, name string, log *zap.Logger) error {
	need := store.GenerationObserved
	f, _, err := s.Floor(ctx)
	if err != nil || f.MinGeneration >= need {
		return err
	}
	ps, err := fleet.Processes(ctx, s)
	if err != nil {
		return err
	}
	if low, at := fleet.Lowest(ps); low < need {
		if c := log.Check(zap.DebugLevel, "floor kept: processes below the generation this release's writers need"); c != nil {
			c.Write(zap.Int("need", need), zap.Int("lowest", low), zap.Any("processes", at))
		}
		return nil
	}
	f, err = s.RaiseFloor(ctx, need, "control server "+name+" ("+version.Version+")")
	if err != nil {
		return err
	}
	log.Info("raised the store's floor", zap.Int("min_generation", f.MinGeneration), zap.String("min_release", f.MinRelease))
	return nil
}
