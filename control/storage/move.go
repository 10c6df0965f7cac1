package storage

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Add carries out p: every stream and bucket grows to p.To replicas, and
// Add returns once every new replica has caught up (within catchup), with
// the placement then. A plan that does not grow changes nothing. Progress
// lines go to progress.
func Add(ctx context.Context, s *store.Store, p AddPlan, catchup time.Duration, progress io.Writer) ([]store.StreamPlacement, error) {
	if !p.Grows() {
		return nil, nil
	}
	fmt.Fprintf(progress, "growing every stream and bucket from %d to %d replicas\n", p.From, p.To)
	deadline := time.Now().Add(catchup)
	if err := s.SetReplicas(ctx, p.To, catchup); err != nil {
		return nil, err
	}
	return waitCaughtUp(ctx, s, p.To, time.Until(deadline))
}

// Remove carries out p while writes go on: when the replica count
// shrinks, leadership moves off p.Node first (a shrinking stream keeps its
// leader) and the count goes down; then the replicas still on p.Node move
// to free nodes, caught up before its copies are dropped. It returns the
// placement once no stream has a replica on p.Node, all within catchup.
// p.Node stays a member of the JetStream meta group (see Forget).
func Remove(ctx context.Context, s *store.Store, p RemovePlan, catchup time.Duration, progress io.Writer) ([]store.StreamPlacement, error) {
	deadline := time.Now().Add(catchup)
	if p.Shrinks() {
		led, err := s.StepDownFrom(ctx, p.Node)
		if err != nil {
			return nil, err
		}
		if len(led) > 0 {
			fmt.Fprintf(progress, "moving the leader of %d streams and buckets off %s\n", len(led), p.Node)
			if _, err := waitPlacement(ctx, s, time.Until(deadline), "leaders to move off "+p.Node, func(sp store.StreamPlacement) bool {
				return sp.Leader != "" && sp.Leader != p.Node
			}); err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(progress, "shrinking every stream and bucket from %d to %d replicas (%d storage nodes remain)\n", p.From, p.To, len(p.Remaining))
		if err := s.SetReplicas(ctx, p.To, time.Until(deadline)); err != nil {
			return nil, err
		}
		if _, err := waitCaughtUp(ctx, s, p.To, time.Until(deadline)); err != nil {
			return nil, err
		}
	}
	moved, err := s.EvacuatePeer(ctx, p.Node)
	if err != nil {
		return nil, err
	}
	if len(moved) > 0 {
		fmt.Fprintf(progress, "moving %d streams and buckets off %s to the other storage nodes\n", len(moved), p.Node)
	}
	return waitPlacement(ctx, s, time.Until(deadline), fmt.Sprintf("%d caught-up replicas without %s", p.To, p.Node), func(sp store.StreamPlacement) bool {
		return caughtUp(sp, p.To) && !slices.Contains(sp.Peers, p.Node)
	})
}

// caughtUp reports whether p has replicas replicas, a leader and none
// lagging.
func caughtUp(p store.StreamPlacement, replicas int) bool {
	return len(p.Peers) == replicas && len(p.Lagging) == 0 && p.Leader != ""
}

func waitCaughtUp(ctx context.Context, s *store.Store, replicas int, timeout time.Duration) ([]store.StreamPlacement, error) {
	return waitPlacement(ctx, s, timeout, fmt.Sprintf("%d caught-up replicas", replicas), func(p store.StreamPlacement) bool {
		return caughtUp(p, replicas)
	})
}

// waitPlacement waits until every stream's placement satisfies ok, and
// returns it; past timeout it fails with a structured error naming what
// it waited for and the streams still waiting.
func waitPlacement(ctx context.Context, s *store.Store, timeout time.Duration, what string, ok func(store.StreamPlacement) bool) ([]store.StreamPlacement, error) {
	deadline := time.Now().Add(timeout)
	for {
		pl, err := s.Placement(ctx)
		var waiting []string
		if err == nil {
			for _, p := range pl {
				if !ok(p) {
					waiting = append(waiting, p.Stream)
				}
			}
			if len(waiting) == 0 {
				return pl, nil
			}
			err = fmt.Errorf("still waiting for %s", strings.Join(waiting, ", "))
		}
		if time.Now().After(deadline) {
			return pl, store.Errorf(store.CodeUnavailable, "waiting for %s: not settled within %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return pl, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
