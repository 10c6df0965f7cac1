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
	obs := map[string]store.GatewayObservation{} // by key
	judge := func() bool {
		serving, total, laggards = 0, 0, nil
		for _, g := range obs {
			// A gateway whose report aged out is not live; the bucket TTL
			// removes it, this check covers the time until then.
			if time.Since(g.At) >= store.GatewayObservationTTL {
				continue
			}
			total++
			if g.AppliedSeq >= seq {
				serving++
			} else {
				laggards = append(laggards, g.Gateway)
			}
		}
		sort.Strings(laggards)
		return len(laggards) == 0
	}
	// One watch for the whole wait: the current reports, then each new one.
	w, err := s.WatchGatewayObservations(ctx)
	if err != nil {
		judge()
		return
	}
	defer w.Stop()
	caughtUp, expired := false, false
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	aging := time.NewTicker(time.Second) // reports age out without an update
	defer aging.Stop()
	for {
		select {
		case <-ctx.Done():
			judge()
			return
		case <-deadline.C:
			expired = true
		case <-aging.C:
		case ent, ok := <-w.Updates():
			switch {
			case !ok:
				judge()
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
		if caughtUp && (judge() || expired) {
			return
		}
	}
}
