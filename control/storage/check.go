package storage

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// Verdict is what `control storage check` says of one stream's copy on one
// storage node.
type Verdict string

const (
	// VerdictOK: the copy holds what its server wrote, as far as the
	// server and the stream's leader can tell.
	VerdictOK Verdict = "ok"
	// VerdictLost: the copy is missing messages: its server found them
	// unreadable, or it holds fewer than the leader's copy at the same
	// last sequence (a hole the server did not report); or every copy of
	// the stream was rebuilt, so none may have been intact.
	VerdictLost Verdict = "lost"
	// VerdictRebuilt: the node found its copy damaged as it started, set
	// it aside and rebuilt it from its peers; it now matches the leader's.
	VerdictRebuilt Verdict = "rebuilt"
	// VerdictRebuilding: as VerdictRebuilt, still catching up.
	VerdictRebuilding Verdict = "rebuilding"
)

// CopyCheck is one stream's copy on one storage node.
type CopyCheck struct {
	Stream  string  `json:"stream"`
	Node    string  `json:"node"`
	Leader  bool    `json:"leader,omitempty"`
	Verdict Verdict `json:"verdict"`
	// Lost is how many messages the copy is missing (VerdictLost).
	Lost uint64 `json:"lost,omitempty"`
	// Rebuilt and Damage are when the node rebuilt its copy and what it
	// had found (VerdictRebuilt, VerdictRebuilding).
	Rebuilt *time.Time `json:"rebuilt,omitempty"`
	Damage  string     `json:"damage,omitempty"`
	// Detail says it in a sentence, with what to do.
	Detail string `json:"detail"`
}

// CheckReport is every copy the storage nodes answered for.
type CheckReport struct {
	Copies []CopyCheck `json:"copies"`
	// Unanswered are storage nodes the placement names that did not
	// answer: their copies are not checked.
	Unanswered []string `json:"unanswered,omitempty"`
	// Clustered is set when there is more than one storage node, which
	// decides the way back from a lost copy.
	Clustered bool `json:"clustered"`
}

// Healthy reports whether no copy is missing messages and every node
// answered. A copy still rebuilding is healthy: it serves nothing until it
// has caught up.
func (r *CheckReport) Healthy() bool {
	if len(r.Unanswered) > 0 {
		return false
	}
	for _, c := range r.Copies {
		if c.Verdict == VerdictLost {
			return false
		}
	}
	return true
}

// Err is the structured failure a check that is not Healthy ends in.
func (r *CheckReport) Err() error {
	if r.Healthy() {
		return nil
	}
	var lost []string
	for _, c := range r.Copies {
		if c.Verdict == VerdictLost {
			lost = append(lost, c.Stream+" on "+c.Node)
		}
	}
	if len(lost) == 0 {
		return store.Errorf(store.CodeUnavailable, "storage nodes %s did not answer: their copies are not checked", strings.Join(r.Unanswered, ", ")).
			With("unanswered", strings.Join(r.Unanswered, ","))
	}
	return store.Errorf(store.CodeStoreDamaged, "copies missing messages: %s", strings.Join(lost, ", ")).
		With("copies", strings.Join(lost, ","))
}

// Check judges every stream copy in the storage nodes' answers (the
// view's Answers, each node's own view of its copies): what its server
// found lost, what it rebuilt at start, and how it compares with the
// leader's copy. A pure function of the view.
func Check(v *View) *CheckReport {
	rep := &CheckReport{}
	type copyOf struct {
		node string
		r    store.StreamReplica
	}
	byStream := map[string][]copyOf{}
	answered := map[string]bool{}
	for _, a := range v.Answers {
		answered[a.Server] = true
		for _, r := range a.Streams {
			byStream[r.Name] = append(byStream[r.Name], copyOf{a.Server, r})
		}
	}
	rep.Clustered = len(v.Nodes) > 1
	for name, copies := range byStream {
		var leader *store.StreamReplica
		for i := range copies {
			if copies[i].r.Leader == copies[i].node {
				leader = &copies[i].r
			}
		}
		// Each node rebuilds from the others: when every copy was
		// rebuilt, none may have been left intact to rebuild from.
		allRebuilt := rep.Clustered
		for _, c := range copies {
			allRebuilt = allRebuilt && c.r.Rebuilt != nil
		}
		for _, c := range copies {
			cc := judge(name, c.node, c.r, leader, rep.Clustered)
			if allRebuilt {
				cc.Verdict = VerdictLost
				cc.Detail = "every copy of this stream was rebuilt from the others, so none may have been left intact (" + cc.Detail +
					"). Compare it with your latest backup; once it is right, delete the quarantines on the storage nodes"
			}
			rep.Copies = append(rep.Copies, cc)
		}
	}
	sort.Slice(rep.Copies, func(i, j int) bool {
		a, b := rep.Copies[i], rep.Copies[j]
		if a.Stream != b.Stream {
			return a.Stream < b.Stream
		}
		return a.Node < b.Node
	})
	missing := map[string]bool{}
	for _, p := range v.Placement {
		for _, peer := range p.Peers {
			if !answered[peer] {
				missing[peer] = true
			}
		}
	}
	for n := range missing {
		rep.Unanswered = append(rep.Unanswered, n)
	}
	sort.Strings(rep.Unanswered)
	return rep
}

// judge is the verdict on one copy, given the leader's (nil when no
// answer came from the leader).
func judge(stream, node string, r store.StreamReplica, leader *store.StreamReplica, clustered bool) CopyCheck {
	c := CopyCheck{Stream: stream, Node: node, Leader: r.Leader == node, Verdict: VerdictOK, Rebuilt: r.Rebuilt, Damage: r.Damage, Detail: "ok"}
	fewer := uint64(0)
	if leader != nil && !c.Leader && r.LastSeq == leader.LastSeq && r.Msgs < leader.Msgs {
		fewer = leader.Msgs - r.Msgs
	}
	switch {
	case r.Lost > 0 || r.LostBytes > 0 || fewer > 0:
		c.Verdict, c.Lost = VerdictLost, max(r.Lost, fewer)
		what := fmt.Sprintf("lost %d messages its server could not read back (%d bytes)", r.Lost, r.LostBytes)
		if fewer > r.Lost {
			what = fmt.Sprintf("lost %d messages: it holds %d fewer than the leader's copy at the same last sequence %d", fewer, fewer, r.LastSeq)
		}
		if clustered && !c.Leader {
			c.Detail = what + fmt.Sprintf(". Rebuild it from its peers: stop storage node %s, move its copy (DATA/jetstream/jetstream/<account>/streams/%s) aside, start it again", node, stream)
		} else {
			c.Detail = what + ". Restore your latest backup (`control storage restore FILE`)"
		}
	case r.Rebuilt != nil && (c.Leader || leader == nil || r.LastSeq >= leader.LastSeq):
		c.Verdict = VerdictRebuilt
		c.Detail = fmt.Sprintf("rebuilt from its peers at %s (it had found %s); the damaged copy is in the node's DATA/%s until you delete it",
			r.Rebuilt.UTC().Format(time.RFC3339), r.Damage, storagenode.QuarantineDir)
	case r.Rebuilt != nil:
		c.Verdict = VerdictRebuilding
		c.Detail = fmt.Sprintf("rebuilding from its peers since %s: at sequence %d of %d", r.Rebuilt.UTC().Format(time.RFC3339), r.LastSeq, leader.LastSeq)
	}
	return c
}
