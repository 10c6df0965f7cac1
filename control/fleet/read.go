package fleet

// What the rest of the control plane reads back: the summaries, a recount
// to check them against, and the gateways that report.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Recount computes every namespace's counts afresh from the instance
// records, their observations and heartbeats in the store, judged at now as the aggregator
// judges them: what its summaries must equal once it has caught up.
func Recount(ctx context.Context, s *store.Store, now time.Time) (map[string]store.Counts, error) {
	beats := map[string]store.MachineBeat{}
	if err := s.ListMachineBeats(ctx, func(b *store.MachineBeat) error {
		beats[b.Machine] = *b
		return nil
	}); err != nil {
		return nil, err
	}
	out := map[string]store.Counts{}
	err := s.ListInstances(ctx, ">", func(_ string, rec *store.InstanceRecord) error {
		c := out[rec.Namespace]
		c.Add(rec.State, isStale(liveness(beats, rec.Machine, now)))
		out[rec.Namespace] = c
		return nil
	})
	return out, err
}

// Differences lists where summaries disagree with counts (a Recount, say):
// namespaces counted otherwise, and summaries of namespaces without
// instances. Sorted; empty when they agree.
func Differences(sums map[string]store.NamespaceStatus, want map[string]store.Counts) []string {
	var diff []string
	for ns, c := range want {
		if got := sums[ns].Counts; got != c {
			diff = append(diff, fmt.Sprintf("%s: summary %+v, recount %+v", ns, got, c))
		}
	}
	for ns := range sums {
		if _, ok := want[ns]; !ok {
			diff = append(diff, ns+" summarised without instances")
		}
	}
	slices.Sort(diff)
	return diff
}

// Read returns every namespace summary in the store, by namespace.
func Read(ctx context.Context, s *store.Store) (map[string]store.NamespaceStatus, error) {
	out := map[string]store.NamespaceStatus{}
	err := s.ListNamespaceStatus(ctx, func(st *store.NamespaceStatus) error {
		out[st.Namespace] = *st
		return nil
	})
	return out, err
}

// Gateway is a gateway reporting now: the routing sequence it applied,
// how far behind the routing stream's head that is, and whether it serves
// a view it knows may be behind.
type Gateway struct {
	Gateway string `json:"gateway"`
	// Region is the gateway's own ("" for none).
	Region     string `json:"region,omitempty"`
	AppliedSeq uint64 `json:"applied_seq"`
	Lag        uint64 `json:"lag"`
	Stale      bool   `json:"stale,omitempty"`
	// Conflicts are the hosts, gateway ports and passthrough hosts it
	// found routed by more than one owner ("entry: owner over others").
	Conflicts []string `json:"conflicts,omitempty"`
	// L4Draining are the instances that left routing to which it still
	// has layer-4 connections, L4Errors the gateway ports it could not
	// open, as of its last observation.
	L4Draining []store.L4Drain     `json:"l4_draining,omitempty"`
	L4Errors   []store.L4PortError `json:"l4_errors,omitempty"`
	// Age is how old its last report is.
	Age time.Duration `json:"-"`
}

// Gateways returns the routing stream's head and the gateways whose
// report has not aged out, by name.
func Gateways(ctx context.Context, s *store.Store) (head uint64, gws []Gateway, err error) {
	info, err := s.RoutingInfo(ctx)
	if err != nil {
		return 0, nil, store.Classify(fmt.Errorf("reading the routing stream: %w", err))
	}
	head = info.State.LastSeq
	gws = []Gateway{}
	err = s.ListGatewayObservations(ctx, func(g *store.GatewayObservation) error {
		age := time.Since(g.At)
		if age >= store.GatewayObservationTTL {
			return nil
		}
		gw := Gateway{Gateway: g.Gateway, Region: g.Region, AppliedSeq: g.AppliedSeq, Stale: g.Stale, Age: age,
			Conflicts: g.Conflicts, L4Draining: g.L4Draining, L4Errors: g.L4Errors}
		if head > g.AppliedSeq {
			gw.Lag = head - g.AppliedSeq
		}
		gws = append(gws, gw)
		return nil
	})
	slices.SortFunc(gws, func(a, b Gateway) int { return strings.Compare(a.Gateway, b.Gateway) })
	return head, gws, err
}
