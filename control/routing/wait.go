package routing

import (
	"context"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// WaitApplied watches the gateways' observations until every live gateway
// has applied routing sequence seq or bound passes (the reports present at
// the start are always read in full). It returns who is serving, how many
// gateways report at all, and the names of those that lag. A deploy waits
// so before it stops what it no longer routes to; `control region --wait`
// so before it says a region's state is applied.
func WaitApplied(ctx context.Context, s *store.Store, seq uint64, bound time.Duration) (serving, total int, laggards []string) {
	WatchGateways(ctx, s, bound, func(obs map[string]store.GatewayObservation) bool {
		serving, total, laggards = 0, 0, nil
		for _, g := range obs {
			total++
			if g.AppliedSeq >= seq {
				serving++
			} else {
				laggards = append(laggards, g.Gateway)
			}
		}
		sort.Strings(laggards)
		return len(laggards) == 0
	})
	return
}

// WatchGateways calls judge with the live gateways' observations (by
// key) until it says done or bound passes: first once every report
// present at the start is read, then at each new report and each second
// (a report ages out without an update). A gateway whose report aged out
// is not live and not passed to judge. If the reports cannot be watched,
// judge sees what is at hand (nothing) once. judge's last call is on the
// reports as they were when the wait ended, so what it computes then is
// the answer.
func WatchGateways(ctx context.Context, s *store.Store, bound time.Duration, judge func(map[string]store.GatewayObservation) bool) {
	obs := map[string]store.GatewayObservation{} // by key
	live := func() bool {
		cur := make(map[string]store.GatewayObservation, len(obs))
		for k, g := range obs {
			// The bucket TTL removes an aged report; this covers the
			// time until then.
			if time.Since(g.At) < store.GatewayObservationTTL {
				cur[k] = g
			}
		}
		return judge(cur)
	}
	// One watch for the whole wait: the current reports, then each new one.
	w, err := s.WatchGatewayObservations(ctx)
	if err != nil {
		live()
		return
	}
	defer w.Stop()
	caughtUp, expired := false, false
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	aging := time.NewTicker(time.Second)
	defer aging.Stop()
	for {
		select {
		case <-ctx.Done():
			live()
			return
		case <-deadline.C:
			expired = true
		case <-aging.C:
		case ent, ok := <-w.Updates():
			switch {
			case !ok:
				live()
				return
			case ent == nil:
				caughtUp = true
			case ent.Operation() != jetstream.KeyValuePut:
				delete(obs, ent.Key())
			default:
				// A report under another gateway's name is not taken.
				var g store.GatewayObservation
				if store.DecodeKeyed(s.Names.GatewaysBucket(), ent.Key(), ent.Value(), &g) == nil {
					obs[ent.Key()] = g
				}
			}
		}
		if caughtUp && (live() || expired) {
			return
		}
	}
}
