package storage

import (
	"fmt"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// Replica counts stay odd: a RAFT group of n tolerates (n-1)/2 failures,
// and an even n tolerates no more than n-1 does while needing one more
// node to commit.

// AddPlan is what adding a storage node does to the replica count.
type AddPlan struct {
	Node string
	// From is the replica count now; To the count after (To == From: no
	// change, the node holds no replicas yet).
	From, To int
	// MaxReplicas is the bound To never passes.
	MaxReplicas int
}

// Grows reports whether carrying p out changes anything.
func (p AddPlan) Grows() bool { return p.To > p.From }

// PlanAdd plans making node hold replicas: it must answer and be a
// current member of the JetStream meta group (as the meta leader sees
// it); the replica count then grows to the largest odd number of members
// online, at most maxReplicas, or stays when that is no more than now.
func PlanAdd(v *View, node string, maxReplicas int) (AddPlan, error) {
	var seen, leaderView *store.StorageNodeStatus
	for i := range v.Answers {
		if v.Answers[i].Server == node {
			seen = &v.Answers[i]
		}
		if v.Answers[i].Server == v.Answers[i].MetaLeader {
			leaderView = &v.Answers[i]
		}
	}
	if seen == nil {
		return AddPlan{}, store.Errorf(store.CodeUnavailable, "storage node %s did not answer: start it with `control server --cluster-listen ... --routes ...` and the same auth dir first", node).
			With("node", node)
	}
	// The node must be current; the count grows with every member online,
	// one still catching up on the meta group included: counting only
	// the current ones, a member lagging for a moment made an add plan no
	// growth and succeed having done nothing.
	current := map[string]bool{}
	online := 0
	if leaderView != nil {
		for _, p := range leaderView.Peers {
			if p.Offline {
				continue
			}
			online++
			if p.Current {
				current[p.Name] = true
			}
		}
	}
	if !current[node] {
		return AddPlan{}, store.Errorf(store.CodeConflict, "storage node %s is not a current member of the JetStream cluster yet (still catching up, or routes missing); try again when `control storage ls` shows it", node).
			With("node", node)
	}
	target := min(online, maxReplicas)
	if target%2 == 0 {
		target--
	}
	have := v.Replicas()
	return AddPlan{Node: node, From: have, To: max(target, have), MaxReplicas: maxReplicas}, nil
}

// RemovePlan is what removing a storage node does to the replica count.
type RemovePlan struct {
	Node string
	// From is the replica count now, To the count after: From, or the
	// largest odd count the remaining nodes can hold.
	From, To int
	// Remaining are the answering storage nodes other than Node.
	Remaining []string
}

// Shrinks reports whether the replica count goes down.
func (p RemovePlan) Shrinks() bool { return p.To < p.From }

// PlanRemove plans taking node's replicas away. It refuses when the
// remaining nodes could not keep write quorum: of the streams (an odd
// replica count on the nodes that answer) and of the JetStream meta group,
// which keeps node as a member (it only stops holding replicas) and so
// needs a majority of its members other than node to stay up.
func PlanRemove(v *View, node string) (RemovePlan, error) {
	var live []string
	found := false
	for _, n := range v.Nodes {
		if n.Name == node {
			found = true
			continue
		}
		if n.Answered {
			live = append(live, n.Name)
		}
	}
	if !found {
		return RemovePlan{}, store.Errorf(store.CodeNotFound, "no storage node %s", node).With("node", node)
	}
	have := v.Replicas()
	target := have
	if len(live) < target {
		target = len(live)
		if target%2 == 0 {
			target--
		}
	}
	members := len(v.Nodes)
	for _, a := range v.Answers {
		members = max(members, a.ClusterSize)
	}
	if target < 1 || len(live) < target/2+1 || len(live) < members/2+1 {
		return RemovePlan{}, store.Errorf(store.CodeQuorumUnavailable, "removing %s would leave %d answering storage nodes (%s) of the %d in the JetStream cluster, "+
			"too few for write quorum (%d needed): bring the missing storage nodes back first", node, len(live), strings.Join(live, ", "), members, members/2+1).
			With("node", node).With("remaining", strings.Join(live, ",")).With("needed", fmt.Sprint(members/2+1))
	}
	return RemovePlan{Node: node, From: have, To: target, Remaining: live}, nil
}

// CheckForget refuses to forget a node that is not a stopped, empty member
// of the JetStream meta group: one that still answers or still holds
// replicas must be removed (and stopped) first.
func CheckForget(v *View, node string) error {
	for _, n := range v.Nodes {
		if n.Name != node {
			continue
		}
		if n.Answered {
			return store.Errorf(store.CodeConflict, "storage node %s still answers: `control storage remove %s` it, then stop its `control server`, then forget it", node, node).
				With("node", node)
		}
		if n.Replicas > 0 {
			return store.Errorf(store.CodeConflict, "storage node %s still holds %d replicas: `control storage remove %s` first (it moves them while writes go on)", node, n.Replicas, node).
				With("node", node)
		}
		return nil
	}
	return store.Errorf(store.CodeNotFound, "no storage node %s in the JetStream meta group", node).With("node", node)
}
