package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// commitWriter appends checkpoint commits through one storage node for as
// long as a test runs storage operations, retrying each commit (same ID,
// deduplicated by the stream) until it is acknowledged.
type commitWriter struct {
	mu     sync.Mutex
	acked  []string
	failed map[string]int // by error code
	stop   chan struct{}
	done   chan struct{}
}

func startCommitWriter(s *store.Store) *commitWriter {
	w := &commitWriter{failed: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	pause := func(d time.Duration) bool {
		select {
		case <-w.stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	go func() {
		defer close(w.done)
		for i := 1; ; i++ {
			id := fmt.Sprintf("w%05d", i)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_, err := s.AppendCommit(ctx, &store.DeployCommit{ID: id, Namespace: "storage-test", Kind: store.CommitCheckpoint,
					Phase: "write", Revision: int64(i), CreatedAt: time.Now().UTC()})
				cancel()
				w.mu.Lock()
				if err == nil {
					w.acked = append(w.acked, id)
				} else {
					w.failed[store.AsError(err).Code]++
				}
				w.mu.Unlock()
				if err == nil {
					break
				}
				if !pause(100 * time.Millisecond) {
					return
				}
			}
			if !pause(20 * time.Millisecond) {
				return
			}
		}
	}()
	return w
}

func (w *commitWriter) acknowledged() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitMore waits until n more commits than now are acknowledged.
func (w *commitWriter) waitMore(t *testing.T, n int, what string) {
	t.Helper()
	base := w.acknowledged()
	eventually(t, 30*time.Second, fmt.Sprintf("%d more acknowledged commits %s", n, what), func() bool {
		return w.acknowledged() >= base+n
	})
}

// finish stops the writer and returns the acknowledged commit IDs and the
// failed attempts (each retried) by error code.
func (w *commitWriter) finish() ([]string, map[string]int) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked, w.failed
}

// commitIDs reads the ID of every commit in the commits stream, in order.
func commitIDs(t *testing.T, s *store.Store) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := storetest.Stream(t, s, s.Names.DeployCommitsStream()).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		c, err := s.CommitAt(ctx, seq)
		if err != nil {
			t.Fatalf("commit %d: %v", seq, err)
		}
		ids = append(ids, c.ID)
	}
	return ids
}

// placementOf summarises every stream's replica count and peers.
func placementOf(t *testing.T, s *store.Store) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pl, err := s.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pl {
		out[p.Stream] = fmt.Sprintf("R%d %s", p.Replicas, strings.Join(p.Peers, ","))
	}
	return out
}

// `control storage remove` takes a storage node's replicas away while
// writes go on, refuses a removal that would break write quorum, and
// `control storage add` gives the node replicas again, caught up: every
// acknowledged commit is on every node's replica at the end.
func TestStorageRemoveAndAddKeepEveryCommit(t *testing.T) {
	sc := newStorageCluster(t)
	s1 := sc.open(1, sc.creds)
	w := startCommitWriter(s1)
	defer func() {
		select {
		case <-w.stop:
		default:
			w.finish()
		}
	}()
	w.waitMore(t, 10, "before any storage operation")
	for stream, p := range placementOf(t, s1) {
		if !strings.HasPrefix(p, "R3 ") || strings.Count(p, ",") != 2 {
			t.Fatalf("stream %s starts as %s, want R3 on all three nodes", stream, p)
		}
	}

	// Remove s3: its replicas go, the streams shrink to the odd count the
	// two remaining nodes can hold (1), and writes go on.
	start := time.Now()
	out, e, code := sc.control(1, "storage", "remove", "s3")
	if code != 0 {
		t.Fatalf("storage remove s3: exit %d\n%s\n%s", code, out, e)
	}
	removeTook := time.Since(start)
	if !strings.Contains(out, "from 3 to 1 replicas") || !strings.Contains(out, "storage node s3 removed") {
		t.Fatalf("storage remove s3 said:\n%s", out)
	}
	after := placementOf(t, s1)
	for stream, p := range after {
		if !strings.HasPrefix(p, "R1 ") || strings.Contains(p, "s3") {
			t.Fatalf("after removing s3, stream %s is %s", stream, p)
		}
	}
	w.waitMore(t, 10, "after removing s3")
	// As the command says: stop its server now. Writes go on without it.
	sc.servers[2].stop(syscall.SIGTERM)
	w.waitMore(t, 10, "with s3 stopped")

	// Refusals, each before it changes anything: s3 cannot be added while
	// it does not answer; removing s1 or s2 now would leave one answering
	// node of the three in the JetStream cluster, below write quorum; an
	// unknown node is not found.
	refused := 0
	for _, tc := range []struct {
		args []string
		code string
		says string
	}{
		{[]string{"storage", "add", "s3"}, store.CodeUnavailable, "did not answer"},
		{[]string{"storage", "remove", "s2"}, store.CodeQuorumUnavailable, "too few for write quorum"},
		{[]string{"storage", "remove", "s1"}, store.CodeQuorumUnavailable, "too few for write quorum"},
		{[]string{"storage", "remove", "s9"}, store.CodeNotFound, "no storage node s9"},
	} {
		out, e, code := sc.control(1, append(tc.args, "-o", "json")...)
		var got struct{ Error store.Error }
		if code != 1 || json.Unmarshal([]byte(e), &got) != nil || got.Error.Code != tc.code || !strings.Contains(got.Error.Message, tc.says) {
			t.Fatalf("control %v: exit %d, want %s (%q)\n%s\n%s", tc.args, code, tc.code, tc.says, out, e)
		}
		refused++
	}
	if now := placementOf(t, s1); fmt.Sprint(now) != fmt.Sprint(after) {
		t.Fatalf("a refused operation changed placement:\nbefore %v\nafter  %v", after, now)
	}
	w.waitMore(t, 5, "after the refusals")

	// s3 comes back (its data dir still holds its old copy) and is added:
	// every stream grows back to three replicas and catches up.
	sc.servers[2] = sc.startNode(3, " (restarted)")
	sc.servers[2].waitOutput(t, `control server ready`, 60*time.Second)
	start = time.Now()
	eventually(t, 30*time.Second, "storage add s3 to succeed", func() bool {
		out, e, code = sc.control(1, "storage", "add", "s3")
		if code != 0 && !strings.Contains(e, "not a current member") {
			t.Fatalf("storage add s3: exit %d\n%s\n%s", code, out, e)
		}
		return code == 0
	})
	addTook := time.Since(start)
	if !strings.Contains(out, "from 1 to 3 replicas") || !strings.Contains(out, "at 3 replicas, all caught up") {
		t.Fatalf("storage add s3 said:\n%s", out)
	}
	for stream, p := range placementOf(t, s1) {
		if !strings.HasPrefix(p, "R3 ") || !strings.Contains(p, "s3") {
			t.Fatalf("after adding s3, stream %s is %s", stream, p)
		}
	}
	w.waitMore(t, 10, "after adding s3")
	acked, failed := w.finish()

	// No acknowledged commit is lost, and the three replicas of the
	// commits stream agree (count, size, last sequence).
	var answers []store.StorageNodeStatus
	eventually(t, 30*time.Second, "the three commit replicas to agree", func() bool {
		var err error
		answers, err = store.GatherStorageStatus(context.Background(), s1.NC, sc.names, 2*time.Second)
		return err == nil && len(answers) == 3 && replicasAgree(answers, sc.names.DeployCommitsStream())
	})
	stored := map[string]bool{}
	ids := commitIDs(t, sc.open(3, sc.creds))
	for _, id := range ids {
		stored[id] = true
	}
	lost := 0
	for _, id := range acked {
		if !stored[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged commits are missing from the commits stream", lost, len(acked))
	}
	var replicas []string
	for _, a := range answers {
		for _, st := range a.Streams {
			if st.Name == sc.names.DeployCommitsStream() {
				replicas = append(replicas, fmt.Sprintf("%s msgs=%d last_seq=%d", a.Server, st.Msgs, st.LastSeq))
			}
		}
	}
	// While a replica set changes, the commits stream may briefly lack a
	// caught-up majority: those attempts are refused (quorum_unavailable),
	// never half-applied, and the writer's retry lands them.
	t.Logf("remove s3 took %s, add s3 took %s; commits acknowledged: %d; write attempts refused and retried, by code: %v; "+
		"storage operations refused: %d; commits lost: %d; commit replicas: %s",
		removeTook.Round(time.Millisecond), addTook.Round(time.Millisecond), len(acked), failed, refused, lost, strings.Join(replicas, "; "))
}

// `control storage forget` takes a removed, stopped node out of the
// JetStream meta group (with the system account's keys from the auth dir),
// refusing while the node still answers or holds replicas; a machine that
// comes back under that name with an empty data dir is added again.
func TestStorageForgetLeavesTheMetaGroup(t *testing.T) {
	sc := newStorageCluster(t)
	s1 := sc.open(1, sc.creds)
	authDir := filepath.Join(sc.dir, "auth")
	forget := func(node string) (string, string, int) {
		return sc.control(1, "storage", "forget", node, "--auth-dir", authDir)
	}
	if out, e, code := forget("s3"); code == 0 || !strings.Contains(e, "still answers") {
		t.Fatalf("forgetting an answering node: %d\n%s\n%s", code, out, e)
	}
	// Stopped but still holding replicas: refused too. Then, as documented,
	// it is removed while it runs and stopped after.
	sc.servers[2].stop(syscall.SIGTERM)
	if out, e, code := forget("s3"); code == 0 || !strings.Contains(e, "still holds") {
		t.Fatalf("forgetting a node that holds replicas: %d\n%s\n%s", code, out, e)
	}
	sc.servers[2] = sc.startNode(3, " (restarted)")
	sc.servers[2].waitOutput(t, `control server ready`, 60*time.Second)
	eventually(t, 60*time.Second, "storage remove s3 to succeed", func() bool {
		out, e, code := sc.control(1, "storage", "remove", "s3")
		if code != 0 && !strings.Contains(e, "did not answer") && !strings.Contains(e, "too few") {
			t.Fatalf("storage remove s3: %d\n%s\n%s", code, out, e)
		}
		return code == 0
	})
	sc.servers[2].stop(syscall.SIGTERM)
	out, e, code := forget("s3")
	if code != 0 || !strings.Contains(out, "now 2 members") {
		t.Fatalf("storage forget s3: %d\n%s\n%s", code, out, e)
	}
	if out, e, code := forget("s3"); code == 0 || !strings.Contains(e, "no storage node s3") {
		t.Fatalf("forgetting s3 twice: %d\n%s\n%s", code, out, e)
	}
	if _, _, err := invites.Create(context.Background(), s1, invites.Spec{TTL: time.Minute}); err != nil {
		t.Fatalf("a write after forgetting s3: %v", err)
	}
	ls, _, _ := sc.control(1, "storage", "ls")
	if strings.Contains(ls, "s3") {
		t.Fatalf("storage ls still lists s3:\n%s", ls)
	}

	// The machine returns under a new name (a forgotten name stays out of
	// the meta group) and is added: every stream is back at R3.
	sc.servers[2] = sc.startNodeNamed(3, "s4", " (replacing s3)")
	sc.servers[2].waitOutput(t, `control server ready`, 60*time.Second)
	eventually(t, 60*time.Second, "storage add s4 to succeed", func() bool {
		out, e, code = sc.control(1, "storage", "add", "s4")
		if code != 0 && !strings.Contains(e, "not a current member") && !strings.Contains(e, "did not answer") {
			t.Fatalf("storage add s4: exit %d\n%s\n%s", code, out, e)
		}
		return code == 0
	})
	for stream, p := range placementOf(t, s1) {
		if !strings.HasPrefix(p, "R3 ") || !strings.Contains(p, "s4") {
			t.Fatalf("after adding s4, stream %s is %s", stream, p)
		}
	}
	for _, a := range storageAnswers(t, s1) {
		if a.ClusterSize != 3 {
			t.Fatalf("%s sees a meta group of %d, want 3 (s1, s2, s4)", a.Server, a.ClusterSize)
		}
	}
}

func storageAnswers(t *testing.T, s *store.Store) []store.StorageNodeStatus {
	t.Helper()
	answers, err := store.GatherStorageStatus(context.Background(), s.NC, s.Names, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return answers
}
