package storage

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/rollout"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// UpgradeOptions say what `control storage upgrade` moves the storage
// nodes to, and how long each step may take.
type UpgradeOptions struct {
	Release string
	// HealthBound is what each node's new release has to pass its health
	// gate in, caught up on every replica it holds (default
	// DefaultNodeHealthBound); past it, the node rolls itself back.
	HealthBound time.Duration
	// Settle bounds the wait for the cluster to be healthy before a node
	// is upgraded (every node answering, write quorum, no replica
	// lagging), for its stream leaders to move off it, and for a node
	// that rolled back to be current again (default 2m).
	Settle time.Duration
	// ReportSlack is how much longer than HealthBound a node has to be
	// seen on its new release (its restart and the status answers'
	// delay) before the rollout calls it failed (default 30s).
	ReportSlack time.Duration
	// Wait is how long storage nodes have to answer each status request
	// (default 1s).
	Wait           time.Duration
	AllowDowngrade bool
	// Nodes limits the upgrade to these storage nodes (default: every
	// node that answers).
	Nodes []string
	// Progress, if set, is told every step.
	Progress func(NodeStep)
}

// NodeStep is one storage node's progress.
type NodeStep struct {
	Node string `json:"node"`
	// State is upgrading, upgraded, current or failed (the Step states
	// of a fleet rollout).
	State string `json:"state"`
	// MetaLeader is set when the node led the JetStream meta group as
	// its upgrade began: it goes last.
	MetaLeader bool          `json:"meta_leader,omitempty"`
	Detail     string        `json:"detail,omitempty"`
	Took       time.Duration `json:"took,omitempty"`
}

// UpgradeResult is a storage upgrade's outcome.
type UpgradeResult struct {
	Release string `json:"release"`
	// Upgraded are the nodes moved, in order, with the time each took.
	Upgraded []NodeStep `json:"upgraded"`
	// Current are the nodes that ran the release already.
	Current []string `json:"current"`
	// Failed is the node that stopped the upgrade; Untouched the nodes
	// it did not reach.
	Failed    *NodeStep `json:"failed,omitempty"`
	Untouched []string  `json:"untouched,omitempty"`
	Took      string    `json:"took"`
}

// Upgrade moves the storage nodes' `control server` to o.Release, one
// node at a time: before each, the cluster must be healthy (Healthy);
// the node's stream leaders move to the other nodes, it is told by a
// signed order to stage the release and restart into it, and the next
// node waits until it answers on the new release, confirmed by its own
// health gate, and the cluster is healthy again. The meta leader goes
// last. A node whose new release does not pass its gate within the
// bound rolls itself back, and the upgrade stops there with an
// upgrade_failed error naming the node and why.
func Upgrade(ctx context.Context, s *store.Store, o UpgradeOptions) (*UpgradeResult, error) {
	start := time.Now()
	if _, err := version.Parse(o.Release); err != nil {
		return nil, store.Errorf(store.CodeInvalid, "%v", err)
	}
	o.HealthBound = orDefault(o.HealthBound, DefaultNodeHealthBound)
	o.Settle = orDefault(o.Settle, 2*time.Minute)
	o.ReportSlack = orDefault(o.ReportSlack, 30*time.Second)
	o.Wait = orDefault(o.Wait, time.Second)
	if err := s.CanOrder("a storage upgrade"); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	// One upgrade at a time, storage or fleet: the two would restart
	// what the other counts on.
	lease, err := s.AcquireLease(ctx, rollout.LockKey, store.LeaseOptions{TTL: 30 * time.Second, Holder: host,
		Purpose: "storage upgrade to " + o.Release, KeepAlive: true})
	if err != nil {
		return nil, err
	}
	defer lease.Release(context.WithoutCancel(ctx))

	view, err := waitHealthy(ctx, s, o, "before the upgrade")
	if err != nil {
		return nil, err
	}
	res := &UpgradeResult{Release: o.Release, Upgraded: []NodeStep{}, Current: []string{}}
	remaining, err := targets(view, o, res)
	if err != nil {
		return nil, err
	}
	for len(remaining) > 0 {
		if view == nil {
			if view, err = waitHealthy(ctx, s, o, "before upgrading "+strings.Join(remaining, ", ")); err != nil {
				res.Untouched = remaining
				res.Took = time.Since(start).Round(time.Millisecond).String()
				return res, err
			}
		}
		node, leader := next(view, remaining)
		remaining = slices.DeleteFunc(remaining, func(n string) bool { return n == node })
		st := upgradeNode(ctx, s, o, node, leader)
		switch st.State {
		case rollout.StepUpgraded:
			res.Upgraded = append(res.Upgraded, st)
		case rollout.StepCurrent:
			res.Current = append(res.Current, node)
		default:
			res.Failed, res.Untouched = &st, remaining
			res.Took = time.Since(start).Round(time.Millisecond).String()
			return res, store.Errorf(store.CodeUpgradeFailed, "storage node %s: %s; the storage upgrade stopped (%d upgraded, %d untouched)",
				node, st.Detail, len(res.Upgraded), len(res.Untouched)).With("node", node).With("reason", st.Detail)
		}
		view = nil
	}
	res.Took = time.Since(start).Round(time.Millisecond).String()
	return res, nil
}

// targets are the answering nodes to upgrade (o.Nodes, if given), sorted;
// those that run o.Release already go to res.Current.
func targets(v *View, o UpgradeOptions, res *UpgradeResult) ([]string, error) {
	release := map[string]string{}
	for _, a := range v.Answers {
		release[a.Server] = a.Release
	}
	var out []string
	for _, n := range v.Nodes {
		if len(o.Nodes) > 0 && !slices.Contains(o.Nodes, n.Name) {
			continue
		}
		if release[n.Name] == o.Release {
			res.Current = append(res.Current, n.Name)
			continue
		}
		if r := release[n.Name]; r != "" && version.Older(o.Release, r) && !o.AllowDowngrade {
			return nil, store.Errorf(store.CodeConflict, "storage node %s runs %s, newer than %s (--allow-downgrade)", n.Name, r, o.Release).
				With("node", n.Name).With("reason", "downgrade")
		}
		out = append(out, n.Name)
	}
	for _, want := range o.Nodes {
		if !slices.ContainsFunc(v.Nodes, func(n NodeView) bool { return n.Name == want }) {
			return nil, store.Errorf(store.CodeNotFound, "no storage node %s", want).With("node", want)
		}
	}
	sort.Strings(out)
	return out, nil
}

// next is the node to upgrade now: the first of remaining that does not
// lead the meta group, and the meta leader only when it is the last one
// left, so that the meta group elects a new leader once, at the end,
// among nodes that all run the new release but one.
func next(v *View, remaining []string) (node string, metaLeader bool) {
	for _, n := range remaining {
		if !isMetaLeader(v, n) {
			return n, false
		}
	}
	return remaining[0], true
}

func isMetaLeader(v *View, node string) bool {
	for _, n := range v.Nodes {
		if n.Name == node {
			return n.MetaLeader
		}
	}
	return false
}

// Healthy is what keeps the storage cluster from taking the restart of
// one node now ("" when nothing does): lost write quorum, a node that
// does not answer, a meta-group member not current, a stream without a
// leader or with a replica catching up.
func Healthy(v *View) string {
	if v.Quorum != nil {
		return v.Quorum.Message
	}
	var silent, behind, lagging []string
	for _, n := range v.Nodes {
		if !n.Answered {
			silent = append(silent, n.Name)
		}
	}
	for _, a := range v.Answers {
		if a.Server != a.MetaLeader {
			continue
		}
		for _, p := range a.Peers {
			if !p.Current || p.Offline {
				behind = append(behind, p.Name)
			}
		}
	}
	for _, p := range v.Placement {
		if p.Leader == "" || len(p.Lagging) > 0 {
			lagging = append(lagging, p.Stream)
		}
	}
	var why []string
	if len(silent) > 0 {
		why = append(why, "storage nodes not answering: "+strings.Join(silent, ", "))
	}
	if len(v.Answers) > 0 && !slices.ContainsFunc(v.Answers, func(a store.StorageNodeStatus) bool { return a.Server == a.MetaLeader }) {
		why = append(why, "no answer from a JetStream meta leader")
	}
	if len(behind) > 0 {
		why = append(why, "meta group members not current: "+strings.Join(behind, ", "))
	}
	if len(lagging) > 0 {
		why = append(why, fmt.Sprintf("%d streams without a leader or with a replica catching up (%s)", len(lagging), strings.Join(lagging, ", ")))
	}
	return strings.Join(why, "; ")
}

// waitHealthy reads the view until it is Healthy, for up to o.Settle.
func waitHealthy(ctx context.Context, s *store.Store, o UpgradeOptions, when string) (*View, error) {
	deadline := time.Now().Add(o.Settle)
	for {
		v, err := Read(ctx, s, o.Wait)
		problem := ""
		if err != nil {
			problem = err.Error()
		} else if problem = Healthy(v); problem == "" {
			return v, nil
		}
		if time.Now().After(deadline) {
			return nil, store.Errorf(store.CodeUnavailable, "the storage cluster is not healthy %s (waited %s): %s", when, o.Settle, problem).With("problem", problem)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// upgradeNode moves node's stream leaders off it, orders it onto
// o.Release and waits until it is back on it and the cluster healthy, or
// it rolled back.
func upgradeNode(ctx context.Context, s *store.Store, o UpgradeOptions, node string, metaLeader bool) NodeStep {
	start := time.Now()
	o.progress(NodeStep{Node: node, State: rollout.StepUpgrading, MetaLeader: metaLeader})
	done := func(state, detail string) NodeStep {
		st := NodeStep{Node: node, State: state, MetaLeader: metaLeader, Detail: detail, Took: time.Since(start).Round(time.Millisecond)}
		o.progress(st)
		return st
	}
	// Writes go on while the node restarts: a stream it leads would
	// stall until its followers noticed the leader gone.
	led, err := s.StepDownFrom(ctx, node)
	if err != nil {
		return done(rollout.StepFailed, "moving its stream leaders off: "+err.Error())
	}
	if len(led) > 0 {
		if _, err := waitPlacement(ctx, s, o.Settle, "leaders to move off "+node, func(sp store.StreamPlacement) bool {
			return sp.Leader != "" && (sp.Leader != node || len(sp.Peers) <= 1)
		}); err != nil {
			return done(rollout.StepFailed, err.Error())
		}
		// The new leaders have heard from every follower, so the node's
		// restart leaves each stream a current majority.
		if _, err := waitHealthy(ctx, s, o, "after moving the leaders off "+node); err != nil {
			return done(rollout.StepFailed, err.Error())
		}
	}
	attempt := int(time.Now().UnixMilli())
	req := store.UpgradeRequest{Release: o.Release, Attempt: attempt, AllowDowngrade: o.AllowDowngrade, HealthBound: store.Duration(o.HealthBound)}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	var rep store.UpgradeReply
	err = s.OrderStorageNode(cctx, node, req, &rep)
	cancel()
	if err != nil {
		return done(rollout.StepFailed, "upgrade refused: "+err.Error())
	}
	if !rep.Restarting {
		return done(rollout.StepCurrent, rep.Detail)
	}
	deadline := time.Now().Add(o.HealthBound + o.ReportSlack)
	for {
		v, err := Read(ctx, s, o.Wait)
		if err == nil {
			for _, a := range v.Answers {
				if a.Server != node || a.Upgrade == nil || a.Upgrade.Attempt != attempt {
					continue
				}
				switch {
				case a.Upgrade.State == upgrade.StateRolledBack && a.Release == rep.From:
					back := "back on " + rep.From
					if _, err := waitHealthy(ctx, s, o, "after the rollback"); err != nil {
						back += ", not current yet: " + err.Error()
					} else {
						back += " and current"
					}
					return done(rollout.StepFailed, fmt.Sprintf("rolled back (%s): %s", back, a.Upgrade.Reason))
				case a.Upgrade.State == upgrade.StateConfirmed && a.Release == o.Release && Healthy(v) == "":
					return done(rollout.StepUpgraded, fmt.Sprintf("%s → %s", rep.From, o.Release))
				}
			}
		}
		if time.Now().After(deadline) {
			return done(rollout.StepFailed, fmt.Sprintf("not back on %s and current within %s of the order (health bound %s)", o.Release, o.HealthBound+o.ReportSlack, o.HealthBound))
		}
		select {
		case <-ctx.Done():
			return done(rollout.StepFailed, "interrupted: "+ctx.Err().Error())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (o UpgradeOptions) progress(st NodeStep) {
	if o.Progress != nil {
		o.Progress(st)
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
