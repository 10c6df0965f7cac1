package fleet

// One writer of the fleet status at a time: the aggregator runs while its
// control server holds the lease, and stands by otherwise.

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// DefaultLeaseTTL is how long a control server that stopped keeps the
// fleet status to itself before another takes over.
const DefaultLeaseTTL = 10 * time.Second

// RunElected runs the aggregator while this process holds the fleet
// status lease (store.FleetStatusLockKey), and stands by while another
// control server holds it: one writer, however many control servers, and
// a standby takes over within the lease's TTL of the holder stopping. It returns
// when ctx ends.
func (a *Aggregator) RunElected(ctx context.Context, holder string) {
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for ctx.Err() == nil {
		l, err := a.s.AcquireLease(ctx, store.FleetStatusLockKey, store.LeaseOptions{TTL: a.cfg.LeaseTTL, Holder: holder,
			Purpose: "fleet status", KeepAlive: true})
		if err != nil {
			if !store.HasCode(err, store.CodeBusy) && ctx.Err() == nil {
				a.log.Warn("taking the fleet status lease", zap.Error(err))
			}
			a.leading.Store(false)
			if !wait(a.cfg.LeaseTTL / 3) {
				return
			}
			continue
		}
		a.leading.Store(true)
		a.log.Info("writing the fleet status", zap.String("holder", holder))
		err = a.runWhile(ctx, l)
		a.leading.Store(false)
		a.mu.Lock()
		clear(a.flushed) // the next writer's now
		clear(a.behind)
		a.told = store.FleetStatusFlushed{}
		a.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = l.Release(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("fleet status stopped; starting again", zap.Error(err))
		if !wait(2 * time.Second) {
			return
		}
	}
}

// runWhile runs the aggregator until ctx ends, it fails, or l is lost.
func (a *Aggregator) runWhile(ctx context.Context, l *store.Lease) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := l.Lost(); err != nil {
					cancel(err)
					return
				}
			}
		}
	}()
	err := a.Run(ctx)
	if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
		return cause
	}
	return err
}

// Writing says whether this aggregator writes the fleet status now (it
// holds the lease).
func (a *Aggregator) Writing() bool { return a.leading.Load() }

// Pending is how many namespaces have changes not yet written.
func (a *Aggregator) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.dirty)
}
