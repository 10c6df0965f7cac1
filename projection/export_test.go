package projection

import (
	"context"

	"github.com/edgeplane/edgeplane/store"
)

// BuildView builds a view from events, for tests outside the package.
func BuildView(evs []store.RoutingEvent) (*View, error) {
	b := newBuilder(emptyView(false))
	for i := range evs {
		if err := b.apply(&evs[i]); err != nil {
			return nil, err
		}
	}
	return b.finish(uint64(len(evs)), false), nil
}

// Unverified makes p apply routing events without checking their
// signatures: the unsigned baseline of BenchmarkEventApply. Call it before
// Run.
func Unverified(p *Projection) { p.skipVerify = true }

// Rebuilt is v with its derived lists (digest, conflicts, host list)
// forgotten, as a view that changed has them.
func Rebuilt(v *View) *View {
	c := *v
	c.lists = new(lazyLists)
	return &c
}

// Loaded loads p from st as a session does, without following the stream,
// and returns what reads and applies every event stored since: a gateway
// catching up. For BenchmarkEventCatchUp.
func Loaded(ctx context.Context, p *Projection, st *store.Store) (catchUp func() error, err error) {
	created, err := p.load(ctx, st)
	if err != nil {
		return nil, err
	}
	return func() error { return p.catchUp(ctx, st, created) }, nil
}

// ApplyStored verifies and applies msgs as read from the stream, in the
// batches a catch-up applies, without reading them: the projection's own
// work per event. For BenchmarkEventVerifyApply.
func ApplyStored(ctx context.Context, p *Projection, st *store.Store, msgs []*store.StoredMsg) error {
	created := p.View().StreamCreated
	for len(msgs) > 0 {
		n := min(len(msgs), maxBatch)
		if err := p.applyBatch(ctx, st, msgs[:n], created, false); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// NoteLiveness hands p a liveness judgement as the session does (p must
// not be running).
func NoteLiveness(p *Projection, r *store.LivenessRecord) { p.noteLiveness(r) }

// SetDown makes down the machines judged down, as a judgement does.
func SetDown(p *Projection, down map[string]MachineDown) { p.setDown(down) }

// HoldSwaps keeps p from swapping in a view until release is called: its
// session stalls in its next apply, as a slow gateway does.
func HoldSwaps(p *Projection) (release func()) {
	p.swapMu.Lock()
	return p.swapMu.Unlock
}

// OnInstall has f see every view p swaps in (call before Run).
func OnInstall(p *Projection, f func(*View)) { p.installed = f }
