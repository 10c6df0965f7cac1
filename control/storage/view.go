// Package storage is the logic of `control storage ls|add|remove|forget|
// import|check|backup|restore`: reading the storage nodes' views and the
// replica placement (Read), planning what adding or removing a storage node
// does to the replica count (PlanAdd, PlanRemove: pure functions of a View
// that refuse with a structured error when the cluster could not take it),
// carrying a plan out while writes go on (Add, Remove), taking a stopped
// node out of the JetStream meta group (Forget), copying a single box's
// store into a cluster (Import), judging every stream's copy on every node
// (Check: ok, lost N messages, rebuilt from its peers), and backups: one
// file of every stream's snapshot, sealed under the store key (Backup,
// backup_file.go says the format), verified whole before a restore writes
// anything, and restored into a fresh store only unless told to replace
// (Restore). A restore skips the live observations and leases, whose
// writers rebuild them.
//
// Upgrades of the storage nodes' `control server` are here too, both
// sides: Upgrade moves the nodes to a release one at a time (the cluster
// Healthy before each, its stream leaders moved off, a signed order, the
// node back on the release and caught up before the next, the meta leader
// last), and NodeUpgrades is a node's own part (LaunchNode at its start,
// the order it answers, the health gate that confirms the release or
// rolls it back to the binary it ran before).
//
// Nothing here prints a result: progress lines go to the io.Writer a caller
// passes, and the caller renders what the functions return.
package storage

import (
	"context"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// View is the storage nodes' state: what `control storage ls` shows and
// what the plans are made from.
type View struct {
	// Quorum is set when the store cannot commit writes now; Placement is
	// then unknown.
	Quorum *store.Error `json:"quorum_error,omitempty"`
	// Nodes are every node an answer named, sorted by name.
	Nodes     []NodeView              `json:"nodes"`
	Placement []store.StreamPlacement `json:"placement,omitempty"`
	// Answers are the storage nodes' own views (store.GatherStorageStatus).
	Answers []store.StorageNodeStatus `json:"answers,omitempty"`
}

// NodeView is one storage node in a View.
type NodeView struct {
	Name       string `json:"name"`
	Answered   bool   `json:"answered"`
	MetaLeader bool   `json:"meta_leader"`
	// Replicas, Leads and Lagging count the streams and buckets with a
	// replica on the node, led by it, and whose replica on it lags.
	Replicas int `json:"replicas"`
	Leads    int `json:"leads"`
	Lagging  int `json:"lagging"`
}

// Read asks the storage nodes for their views (answers arriving within
// wait) and, when write quorum holds, reads the replica placement. A lost
// quorum is part of the view (Quorum), not an error: `storage ls` shows it.
func Read(ctx context.Context, s *store.Store, wait time.Duration) (*View, error) {
	v := &View{}
	answers, err := store.GatherStorageStatus(ctx, s.NC, s.Names, wait)
	if err != nil {
		return nil, err
	}
	v.Answers = answers
	if qerr := s.RequireQuorum(ctx); qerr != nil {
		if !store.HasCode(qerr, store.CodeQuorumUnavailable) {
			return nil, qerr
		}
		v.Quorum = store.AsError(qerr)
	} else {
		if v.Placement, err = s.Placement(ctx); err != nil {
			return nil, err
		}
	}
	v.Nodes = nodes(v.Answers, v.Placement)
	return v, nil
}

// nodes is every node the answers and the placement name, with what they
// say of it, sorted by name.
func nodes(answers []store.StorageNodeStatus, placement []store.StreamPlacement) []NodeView {
	byName := map[string]*NodeView{}
	node := func(name string) *NodeView {
		if byName[name] == nil {
			byName[name] = &NodeView{Name: name}
		}
		return byName[name]
	}
	for _, a := range answers {
		node(a.Server).Answered = true
		for _, p := range a.Peers {
			node(p.Name)
		}
		if a.MetaLeader != "" {
			node(a.MetaLeader).MetaLeader = true
		}
	}
	for _, p := range placement {
		for _, peer := range p.Peers {
			node(peer).Replicas++
		}
		if p.Leader != "" {
			node(p.Leader).Leads++
		}
		for _, l := range p.Lagging {
			node(l).Lagging++
		}
	}
	var out []NodeView
	for _, nv := range byName {
		out = append(out, *nv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// RequireQuorum refuses, with the view's quorum_unavailable error, a
// command that changes placement while the store cannot commit.
func (v *View) RequireQuorum() error {
	if v.Quorum != nil {
		return v.Quorum
	}
	return nil
}

// Replicas is the largest replica count of any stream (at least 1).
func (v *View) Replicas() int {
	have := 1
	for _, p := range v.Placement {
		have = max(have, p.Replicas)
	}
	return have
}
