package storage

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func replica(name, leader string, msgs, last uint64) store.StreamReplica {
	return store.StreamReplica{Name: name, Leader: leader, Msgs: msgs, FirstSeq: 1, LastSeq: last}
}

func nodeAnswer(server string, rs ...store.StreamReplica) store.StorageNodeStatus {
	return store.StorageNodeStatus{Server: server, Streams: rs}
}

// Every verdict, judged from the nodes' own answers against the leader's
// copy.
func TestCheckVerdicts(t *testing.T) {
	at := time.Date(2026, 11, 27, 13, 0, 0, 0, time.UTC)
	lost := replica("A", "s1", 90, 100)
	lost.Lost, lost.LostBytes = 10, 4000
	rebuilt := replica("B", "s1", 100, 100)
	rebuilt.Rebuilt, rebuilt.Damage = &at, "1.blk (stream B): a record whose checksum does not match at offset 7"
	rebuilding := replica("C", "s1", 40, 40)
	rebuilding.Rebuilt, rebuilding.Damage = &at, "1.blk (stream C): truncated"
	v := &View{
		Nodes: []NodeView{{Name: "s1"}, {Name: "s2"}, {Name: "s3"}},
		Answers: []store.StorageNodeStatus{
			nodeAnswer("s1", replica("A", "s1", 100, 100), replica("B", "s1", 100, 100), replica("C", "s1", 100, 100), replica("D", "s1", 100, 100)),
			nodeAnswer("s2", lost, replica("B", "s1", 100, 100), replica("C", "s1", 100, 100), replica("D", "s1", 97, 100)),
			nodeAnswer("s3", replica("A", "s1", 99, 99), rebuilt, rebuilding, replica("D", "s1", 100, 100)),
		},
		Placement: []store.StreamPlacement{{Stream: "A", Peers: []string{"s1", "s2", "s3"}}},
	}
	rep := Check(v)
	got := map[string]CopyCheck{}
	for _, c := range rep.Copies {
		got[c.Stream+"@"+c.Node] = c
	}
	if len(rep.Copies) != 12 {
		t.Fatalf("copies: %+v", rep.Copies)
	}
	for key, want := range map[string]struct {
		verdict Verdict
		lost    uint64
		detail  string
	}{
		"A@s1": {VerdictOK, 0, "ok"},
		"A@s2": {VerdictLost, 10, "lost 10 messages its server could not read back (4000 bytes). Rebuild it from its peers: stop storage node s2"},
		"A@s3": {VerdictOK, 0, "ok"}, // one behind: lag, not loss
		"B@s3": {VerdictRebuilt, 0, "rebuilt from its peers at 2026-11-27T13:00:00Z (it had found 1.blk (stream B): a record whose checksum"},
		"C@s3": {VerdictRebuilding, 0, "rebuilding from its peers since 2026-11-27T13:00:00Z: at sequence 40 of 100"},
		"D@s2": {VerdictLost, 3, "lost 3 messages: it holds 3 fewer than the leader's copy at the same last sequence 100"},
	} {
		c := got[key]
		if c.Verdict != want.verdict || c.Lost != want.lost || !strings.HasPrefix(c.Detail, want.detail) {
			t.Errorf("%s: %+v, want %v %d %q", key, c, want.verdict, want.lost, want.detail)
		}
	}
	if !got["A@s1"].Leader || got["A@s2"].Leader {
		t.Errorf("leaders: %+v", rep.Copies)
	}
	if rep.Healthy() || !store.HasCode(rep.Err(), store.CodeStoreDamaged) || !strings.Contains(rep.Err().Error(), "A on s2, D on s2") {
		t.Fatalf("report with lost copies: %v", rep.Err())
	}

	// A single box has no peers to rebuild from: the way back is a backup.
	box := Check(&View{Nodes: []NodeView{{Name: "edgeplane"}}, Answers: []store.StorageNodeStatus{nodeAnswer("edgeplane", func() store.StreamReplica {
		r := replica("A", "edgeplane", 9, 10)
		r.Lost = 1
		return r
	}())}})
	if len(box.Copies) != 1 || box.Copies[0].Verdict != VerdictLost || !strings.Contains(box.Copies[0].Detail, "control storage restore FILE") {
		t.Fatalf("single box: %+v", box.Copies)
	}

	// A node the placement names that did not answer is not checked.
	quiet := Check(&View{Nodes: []NodeView{{Name: "s1"}, {Name: "s2"}}, Answers: v.Answers[:1], Placement: v.Placement})
	if quiet.Healthy() || strings.Join(quiet.Unanswered, ",") != "s2,s3" || !store.HasCode(quiet.Err(), store.CodeUnavailable) {
		t.Fatalf("unanswered: %+v %v", quiet, quiet.Err())
	}
	// Every copy rebuilt: none may have been intact to rebuild from.
	all := Check(&View{Nodes: []NodeView{{Name: "s1"}, {Name: "s2"}}, Answers: []store.StorageNodeStatus{
		nodeAnswer("s1", rebuilt), nodeAnswer("s2", rebuilt),
	}})
	if all.Healthy() || len(all.Copies) != 2 || all.Copies[0].Verdict != VerdictLost || !strings.HasPrefix(all.Copies[1].Detail, "every copy of this stream was rebuilt") {
		t.Fatalf("every copy rebuilt: %+v", all.Copies)
	}
	healthy := Check(&View{Nodes: []NodeView{{Name: "s1"}}, Answers: v.Answers[:1]})
	if !healthy.Healthy() || healthy.Err() != nil {
		t.Fatalf("healthy: %+v", healthy)
	}
}

// clusterNode is a storage node of startCheckCluster, answering the status
// subject as `control server` does.
type clusterNode struct {
	cfg  storagenode.Config
	ns   *server.Server
	stop func()
}

func (n *clusterNode) start(t *testing.T, names store.Names) {
	t.Helper()
	ns, err := storagenode.Start(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := storagenode.ServeStatus(t.Context(), nc, names, ns)
	if err != nil {
		t.Fatal(err)
	}
	n.ns = ns
	n.stop = func() { stop(); nc.Close(); ns.Shutdown(); ns.WaitForShutdown() }
}

// A storage node of three whose copy of a stream was damaged while it was
// down rebuilds it from its peers as it starts, and `storage check` says
// so: every copy ok or rebuilt, none lost.
func TestCheckSaysRebuilt(t *testing.T) {
	names, _ := store.NewNames("", "")
	ports := make([]string, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().String()
		l.Close()
	}
	nodes := make([]*clusterNode, 3)
	for i := range nodes {
		nodes[i] = &clusterNode{cfg: storagenode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: fmt.Sprintf("s%d", i+1),
			StoreKey: strings.Repeat("k", 32), Cluster: &storagenode.ClusterConfig{Name: "edge", Listen: ports[i], Routes: ports}}}
		nodes[i].start(t, names)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop()
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	nc, err := store.Connect(store.ConnectOptions{URL: nodes[0].ns.ClientURL(), ReconnectForever: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := store.WaitForJetStream(ctx, nc); err != nil {
		t.Fatal(err)
	}
	var s *store.Store
	storetest.Eventually(t, 30*time.Second, "provisioning R3", func() bool {
		s, err = store.Provision(ctx, nc, names, store.Layout{Replicas: 3})
		return err == nil
	})
	for range 20 {
		if _, _, err := invites.Create(ctx, s, invites.Spec{Region: "eu", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	// Every copy is ok, and s3 holds what the leaders hold.
	var rep *CheckReport
	storetest.Eventually(t, 20*time.Second, "every copy ok", func() bool {
		v, err := Read(ctx, s, time.Second)
		if err != nil {
			return false
		}
		rep = Check(v)
		for _, c := range rep.Copies {
			if c.Verdict != VerdictOK {
				return false
			}
		}
		return rep.Healthy() && len(rep.Copies) > 0 && len(v.Answers) == 3 && caughtUpEverywhere(v)
	})

	s3 := nodes[2]
	s3.stop()
	blk := largestBlock(t, s3.cfg.DataDir)
	stream := filepath.Base(filepath.Dir(filepath.Dir(blk)))
	b, _ := os.ReadFile(blk)
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(blk, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s3.start(t, names)

	storetest.Eventually(t, 30*time.Second, stream+" rebuilt on s3", func() bool {
		v, err := Read(ctx, s, time.Second)
		if err != nil || len(v.Answers) != 3 {
			return false
		}
		rep = Check(v)
		for _, c := range rep.Copies {
			if c.Stream == stream && c.Node == "s3" {
				return c.Verdict == VerdictRebuilt && rep.Healthy()
			}
		}
		return false
	})
	for _, c := range rep.Copies {
		if c.Verdict != VerdictOK && !(c.Stream == stream && c.Node == "s3") {
			t.Errorf("%s on %s: %s", c.Stream, c.Node, c.Detail)
		}
		if c.Stream == stream && c.Node == "s3" && !strings.Contains(c.Detail, blk) {
			t.Errorf("the rebuilt copy does not name the damaged file: %s", c.Detail)
		}
	}
	t.Logf("%s on s3: %s", stream, func() string {
		for _, c := range rep.Copies {
			if c.Stream == stream && c.Node == "s3" {
				return c.Detail
			}
		}
		return ""
	}())
}

// caughtUpEverywhere reports whether every node's copy of every stream is
// at its leader's last sequence.
func caughtUpEverywhere(v *View) bool {
	last := map[string]uint64{}
	for _, a := range v.Answers {
		for _, r := range a.Streams {
			if r.Leader == a.Server {
				last[r.Name] = r.LastSeq
			}
		}
	}
	for _, a := range v.Answers {
		for _, r := range a.Streams {
			if l, ok := last[r.Name]; !ok || r.LastSeq != l {
				return false
			}
		}
	}
	return true
}

// largestBlock is the largest message block of the store in dataDir.
func largestBlock(t *testing.T, dataDir string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dataDir, "jetstream", "jetstream", "*", "streams", "*", "msgs", "*.blk"))
	var best string
	var size int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Size() > size {
			best, size = f, fi.Size()
		}
	}
	if best == "" {
		t.Fatalf("no block with data in %s", dataDir)
	}
	return best
}
