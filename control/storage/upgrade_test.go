package storage

import (
	"slices"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// What keeps a cluster from taking one node's restart: each problem is
// named, and a healthy cluster has none.
func TestHealthyNamesWhatKeepsAnUpgradeWaiting(t *testing.T) {
	lagging := three(3)
	lagging.Placement[1].Lagging = []string{"s3"}
	leaderless := three(3)
	leaderless.Placement[0].Leader = ""
	metaBehind := view(streams(2, 3, "s1", "s2", "s3"),
		answer("s1", "s1", current("s1"), current("s2"), behind("s3")), answer("s2", "s1"), answer("s3", "s1"))
	noLeaderAnswer := view(streams(2, 3, "s1", "s2", "s3"), answer("s2", "s1", current("s1"), current("s2"), current("s3")), answer("s3", "s1"))
	lost := three(3)
	lost.Quorum = store.Errorf(store.CodeQuorumUnavailable, "write quorum unavailable: 1 of 3")
	for _, tc := range []struct {
		name string
		v    *View
		want string
	}{
		{"healthy", three(3), ""},
		{"a node down", members(3, 3, "s3"), "storage nodes not answering: s3"},
		{"a replica lagging", lagging, "1 streams without a leader or with a replica catching up (SB)"},
		{"a stream without a leader", leaderless, "(SA)"},
		{"a meta member behind", metaBehind, "meta group members not current: s3"},
		{"no answer from the meta leader", noLeaderAnswer, "storage nodes not answering: s1"},
		{"quorum lost", lost, "write quorum unavailable"},
	} {
		got := Healthy(tc.v)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: Healthy = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Nodes go in name order, the meta leader last whatever its name.
func TestNextLeavesTheMetaLeaderLast(t *testing.T) {
	v := view(streams(1, 3, "s1", "s2", "s3"),
		answer("s1", "s2", current("s1"), current("s2"), current("s3")), answer("s2", "s2"), answer("s3", "s2"))
	remaining := []string{"s1", "s2", "s3"}
	var order []string
	for len(remaining) > 0 {
		n, leader := next(v, remaining)
		if leader != (n == "s2") {
			t.Fatalf("next = %s, meta leader %v", n, leader)
		}
		order = append(order, n)
		remaining = slices.DeleteFunc(remaining, func(r string) bool { return r == n })
	}
	if !slices.Equal(order, []string{"s1", "s3", "s2"}) {
		t.Fatalf("order %v, want s1 s3 s2", order)
	}
}

// The nodes to upgrade: those not on the release yet, limited to --nodes;
// an unknown node and a node newer than the release (without
// --allow-downgrade) are refused before anything moves.
func TestUpgradeTargets(t *testing.T) {
	v := three(3)
	for i, rel := range []string{"1.0.0", "1.1.0", "1.0.0"} {
		v.Answers[i].Release = rel
	}
	res := &UpgradeResult{}
	got, err := targets(v, UpgradeOptions{Release: "1.1.0"}, res)
	if err != nil || !slices.Equal(got, []string{"s1", "s3"}) || !slices.Equal(res.Current, []string{"s2"}) {
		t.Fatalf("targets = %v, current %v, %v", got, res.Current, err)
	}
	got, err = targets(v, UpgradeOptions{Release: "1.1.0", Nodes: []string{"s3"}}, &UpgradeResult{})
	if err != nil || !slices.Equal(got, []string{"s3"}) {
		t.Fatalf("--nodes s3: %v, %v", got, err)
	}
	if _, err := targets(v, UpgradeOptions{Release: "1.1.0", Nodes: []string{"s9"}}, &UpgradeResult{}); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("--nodes s9: %v", err)
	}
	if _, err := targets(v, UpgradeOptions{Release: "1.0.5"}, &UpgradeResult{}); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("a downgrade of s2: %v", err)
	}
	if got, err := targets(v, UpgradeOptions{Release: "1.0.5", AllowDowngrade: true}, &UpgradeResult{}); err != nil || len(got) != 3 {
		t.Fatalf("a downgrade allowed: %v, %v", got, err)
	}
}
