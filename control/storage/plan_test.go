package storage

import (
	"slices"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// A test cluster's views. The meta leader's answer lists every member as
// it sees it; other nodes' answers matter only for having answered and
// for the meta group's size.

func current(name string) store.StoragePeer { return store.StoragePeer{Name: name, Current: true} }

func behind(name string) store.StoragePeer { return store.StoragePeer{Name: name} }

func offline(name string) store.StoragePeer {
	return store.StoragePeer{Name: name, Current: true, Offline: true}
}

// answer is server's view: leader is the meta leader it follows, peers the
// meta group's members.
func answer(server, leader string, peers ...store.StoragePeer) store.StorageNodeStatus {
	return store.StorageNodeStatus{Server: server, MetaLeader: leader, ClusterSize: len(peers), Peers: peers}
}

// streams places n streams at replicas replicas on peers, led by the first.
func streams(n, replicas int, peers ...string) []store.StreamPlacement {
	var out []store.StreamPlacement
	for i := range n {
		out = append(out, store.StreamPlacement{Stream: "S" + string(rune('A'+i)), Replicas: replicas, Peers: peers, Leader: peers[0]})
	}
	return out
}

// view is what Read makes of answers and placement.
func view(placement []store.StreamPlacement, answers ...store.StorageNodeStatus) *View {
	return &View{Answers: answers, Placement: placement, Nodes: nodes(answers, placement)}
}

// three is a healthy cluster of s1 (meta leader), s2, s3 at replicas r.
func three(r int) *View {
	peers := []store.StoragePeer{current("s1"), current("s2"), current("s3")}
	on := []string{"s1", "s2", "s3"}[:r]
	return view(streams(2, r, on...), answer("s1", "s1", peers...), answer("s2", "s1", peers...), answer("s3", "s1", peers...))
}

// members is a healthy cluster of n nodes s1..sn (s1 the meta leader) at
// replicas r, with the nodes in down not answering.
func members(n, r int, down ...string) *View {
	var peers []store.StoragePeer
	var names []string
	for i := 1; i <= n; i++ {
		name := "s" + string(rune('0'+i))
		names = append(names, name)
		if slices.Contains(down, name) {
			peers = append(peers, offline(name))
		} else {
			peers = append(peers, current(name))
		}
	}
	var answers []store.StorageNodeStatus
	for _, name := range names {
		if !slices.Contains(down, name) {
			answers = append(answers, answer(name, "s1", peers...))
		}
	}
	return view(streams(2, r, names[:r]...), answers...)
}

// wantRefusal checks err is the structured refusal code with message msg.
func wantRefusal(t *testing.T, err error, code, msg string, detail map[string]string) {
	t.Helper()
	se := store.AsError(err)
	if err == nil || se.Code != code || se.Message != msg {
		t.Fatalf("got %v, want %s: %s", err, code, msg)
	}
	for k, v := range detail {
		if se.Detail[k] != v {
			t.Errorf("detail %s = %q, want %q (all: %v)", k, se.Detail[k], v, se.Detail)
		}
	}
}

func TestPlanAdd(t *testing.T) {
	// s4 joined the cluster and answers, but the meta leader does not count
	// it current (yet).
	joining := func(p store.StoragePeer) *View {
		peers := []store.StoragePeer{current("s1"), current("s2"), current("s3"), p}
		return view(streams(2, 3, "s1", "s2", "s3"), answer("s1", "s1", peers...), answer("s2", "s1", peers...), answer("s3", "s1", peers...), answer("s4", "s1", peers...))
	}
	notCurrent := "storage node s4 is not a current member of the JetStream cluster yet (still catching up, or routes missing); try again when `control storage ls` shows it"
	for _, tc := range []struct {
		name     string
		view     *View
		node     string
		max      int
		from, to int
		code     string // a refusal
		msg      string
	}{
		{name: "did not answer", view: three(3), node: "s4", max: 5, code: store.CodeUnavailable,
			msg: "storage node s4 did not answer: start it with `control server --cluster-listen ... --routes ...` and the same auth dir first"},
		{name: "behind the meta leader", view: joining(behind("s4")), node: "s4", max: 5, code: store.CodeConflict, msg: notCurrent},
		{name: "offline to the meta leader", view: joining(offline("s4")), node: "s4", max: 5, code: store.CodeConflict, msg: notCurrent},
		{name: "unknown to the meta leader", view: view(streams(2, 3, "s1", "s2", "s3"),
			answer("s1", "s1", current("s1"), current("s2"), current("s3")), answer("s4", "s1", current("s4"))), node: "s4", max: 5, code: store.CodeConflict, msg: notCurrent},
		{name: "no meta leader answered", view: view(streams(2, 3, "s1", "s2", "s3"),
			answer("s2", "s1", current("s1"), current("s2"), current("s4")), answer("s4", "s1", current("s1"), current("s2"), current("s4"))), node: "s4", max: 5, code: store.CodeConflict, msg: notCurrent},
		{name: "a single box's second node stays at 1", view: members(2, 1), node: "s2", max: 5, from: 1, to: 1},
		{name: "third node grows 1 to 3", view: members(3, 1), node: "s3", max: 5, from: 1, to: 3},
		{name: "fourth node: even, stays at 3", view: members(4, 3), node: "s4", max: 5, from: 3, to: 3},
		{name: "fifth node grows 3 to 5", view: members(5, 3), node: "s5", max: 5, from: 3, to: 5},
		{name: "seventh node: already at the odd maximum", view: members(7, 5), node: "s7", max: 5, from: 5, to: 5},
		{name: "seven nodes grow 3 to the maximum 5", view: members(7, 3), node: "s7", max: 5, from: 3, to: 5},
		{name: "an even maximum is rounded down", view: members(5, 3), node: "s5", max: 4, from: 3, to: 3},
		{name: "a maximum below the count never shrinks", view: members(5, 5), node: "s5", max: 3, from: 5, to: 5},
		{name: "a node already holding replicas", view: three(3), node: "s2", max: 5, from: 3, to: 3},
		{name: "a member catching up still counts", view: view(streams(2, 1, "s1"),
			answer("s1", "s1", current("s1"), behind("s2"), current("s3")), answer("s3", "s1", current("s1"), behind("s2"), current("s3"))),
			node: "s3", max: 5, from: 1, to: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanAdd(tc.view, tc.node, tc.max)
			if tc.code != "" {
				wantRefusal(t, err, tc.code, tc.msg, map[string]string{"node": tc.node})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := AddPlan{Node: tc.node, From: tc.from, To: tc.to, MaxReplicas: tc.max}
			if p != want || p.Grows() != (tc.to > tc.from) {
				t.Fatalf("plan %+v, want %+v", p, want)
			}
		})
	}
}

func TestPlanRemove(t *testing.T) {
	// s1..s3 answer; the meta group has five members.
	fiveMembers := members(3, 3)
	for i := range fiveMembers.Answers {
		fiveMembers.Answers[i].ClusterSize = 5
	}
	for _, tc := range []struct {
		name      string
		view      *View
		node      string
		from, to  int
		remaining []string
		code      string // a refusal
		msg       string
		detail    map[string]string
	}{
		{name: "unknown node", view: three(3), node: "s9", code: store.CodeNotFound, msg: "no storage node s9", detail: map[string]string{"node": "s9"}},
		{name: "3 to 1 when two of three remain", view: three(3), node: "s3", from: 3, to: 1, remaining: []string{"s1", "s2"}},
		{name: "the meta leader itself", view: three(3), node: "s1", from: 3, to: 1, remaining: []string{"s2", "s3"}},
		{name: "a stopped node", view: members(3, 3, "s3"), node: "s3", from: 3, to: 1, remaining: []string{"s1", "s2"}},
		{name: "five nodes keep 3", view: members(5, 3), node: "s5", from: 3, to: 3, remaining: []string{"s1", "s2", "s3", "s4"}},
		{name: "four nodes keep 3", view: members(4, 3), node: "s2", from: 3, to: 3, remaining: []string{"s1", "s3", "s4"}},
		{name: "quorum would be lost: another node is down", view: members(3, 3, "s2"), node: "s3", code: store.CodeQuorumUnavailable,
			msg:    "removing s3 would leave 1 answering storage nodes (s1) of the 3 in the JetStream cluster, too few for write quorum (2 needed): bring the missing storage nodes back first",
			detail: map[string]string{"node": "s3", "remaining": "s1", "needed": "2"}},
		{name: "quorum would be lost: a meta group of two", view: members(2, 1), node: "s2", code: store.CodeQuorumUnavailable,
			msg:    "removing s2 would leave 1 answering storage nodes (s1) of the 2 in the JetStream cluster, too few for write quorum (2 needed): bring the missing storage nodes back first",
			detail: map[string]string{"node": "s2", "remaining": "s1", "needed": "2"}},
		{name: "quorum would be lost: members that did not answer", view: fiveMembers, node: "s3", code: store.CodeQuorumUnavailable,
			msg:    "removing s3 would leave 2 answering storage nodes (s1, s2) of the 5 in the JetStream cluster, too few for write quorum (3 needed): bring the missing storage nodes back first",
			detail: map[string]string{"node": "s3", "remaining": "s1,s2", "needed": "3"}},
		{name: "the last node", view: members(1, 1), node: "s1", code: store.CodeQuorumUnavailable,
			msg:    "removing s1 would leave 0 answering storage nodes () of the 1 in the JetStream cluster, too few for write quorum (1 needed): bring the missing storage nodes back first",
			detail: map[string]string{"node": "s1", "remaining": "", "needed": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanRemove(tc.view, tc.node)
			if tc.code != "" {
				wantRefusal(t, err, tc.code, tc.msg, tc.detail)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Node != tc.node || p.From != tc.from || p.To != tc.to || !slices.Equal(p.Remaining, tc.remaining) || p.Shrinks() != (tc.to < tc.from) {
				t.Fatalf("plan %+v, want %d to %d with %v remaining", p, tc.from, tc.to, tc.remaining)
			}
		})
	}
}

func TestCheckForget(t *testing.T) {
	removed := members(4, 3, "s4") // s4 stopped, holding no replicas
	holding := members(3, 3, "s3") // s3 stopped, still holding replicas
	for _, tc := range []struct {
		name, node, code, msg string
		view                  *View
	}{
		{name: "stopped and empty", view: removed, node: "s4"},
		{name: "still answers", view: three(3), node: "s3", code: store.CodeConflict,
			msg: "storage node s3 still answers: `control storage remove s3` it, then stop its `control server`, then forget it"},
		{name: "still holds replicas", view: holding, node: "s3", code: store.CodeConflict,
			msg: "storage node s3 still holds 2 replicas: `control storage remove s3` first (it moves them while writes go on)"},
		{name: "not a member", view: removed, node: "s9", code: store.CodeNotFound, msg: "no storage node s9 in the JetStream meta group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckForget(tc.view, tc.node)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantRefusal(t, err, tc.code, tc.msg, map[string]string{"node": tc.node})
		})
	}
}

func TestViewNodesAndReplicas(t *testing.T) {
	pl := []store.StreamPlacement{
		{Stream: "A", Replicas: 3, Peers: []string{"s1", "s2", "s3"}, Leader: "s1", Lagging: []string{"s3"}},
		{Stream: "B", Replicas: 1, Peers: []string{"s2"}, Leader: "s2"},
		{Stream: "C", Replicas: 3, Peers: []string{"s1", "s2", "s4"}},
	}
	peers := []store.StoragePeer{current("s1"), current("s2"), current("s3"), offline("s4")}
	v := view(pl, answer("s2", "s1", peers...), answer("s3", "s1", peers...))
	want := []NodeView{
		{Name: "s1", MetaLeader: true, Replicas: 2, Leads: 1},
		{Name: "s2", Answered: true, Replicas: 3, Leads: 1},
		{Name: "s3", Answered: true, Replicas: 1, Lagging: 1},
		{Name: "s4", Replicas: 1},
	}
	if !slices.Equal(v.Nodes, want) {
		t.Fatalf("nodes:\n%+v\nwant:\n%+v", v.Nodes, want)
	}
	if v.Replicas() != 3 {
		t.Fatalf("replicas %d, want 3", v.Replicas())
	}
	if (&View{}).Replicas() != 1 {
		t.Fatal("a view without placement (quorum lost) counts 1 replica")
	}
	if err := v.RequireQuorum(); err != nil {
		t.Fatalf("quorum held: %v", err)
	}
	v.Quorum = store.Errorf(store.CodeQuorumUnavailable, "lost")
	if err := v.RequireQuorum(); !store.HasCode(err, store.CodeQuorumUnavailable) {
		t.Fatalf("quorum lost: %v", err)
	}
}
