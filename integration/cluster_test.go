package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

const clusterApp = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    env: {VERSION: "@V@"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`

func writeManifest(t *testing.T, dir, version string) string {
	t.Helper()
	body := strings.ReplaceAll(strings.ReplaceAll(clusterApp, "@HELLO@", bins.hello), "@V@", version)
	p := filepath.Join(dir, "v"+version+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// killAgentInstances ends the instances an agent data dir recorded.
func killAgentInstances(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "instances", "*.json"))
	for _, f := range files {
		var st struct {
			Runtime struct{ PID int } `json:"runtime"`
		}
		b, _ := os.ReadFile(f)
		if json.Unmarshal(b, &st) == nil && st.Runtime.PID > 0 {
			_ = syscall.Kill(-st.Runtime.PID, syscall.SIGKILL)
		}
	}
}

// finalCommitIDs reads every final commit's ID from the commits stream.
func finalCommitIDs(t *testing.T, s *store.Store) []string {
	t.Helper()
	ids, err := readFinalCommitIDs(s)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func readFinalCommitIDs(s *store.Store) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	commits, err := s.JS.Stream(ctx, s.Names.DeployCommitsStream())
	if err != nil {
		return nil, err
	}
	info, err := commits.Info(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		c, err := s.CommitAt(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("commit %d: %w", seq, err)
		}
		if c.Kind == store.CommitFinal {
			ids = append(ids, c.ID)
		}
	}
	return ids, nil
}

// A partitioned storage node refuses every write with quorum_unavailable,
// naming the nodes it cannot reach; the majority keeps committing; after
// healing, the three replicas of every commit agree and nothing is lost.
func TestPartitionMinorityRefusesMajorityCommits(t *testing.T) {
	sc := newStorageCluster(t)
	ctx := context.Background()

	// An agent in the root namespace with agent-role credentials, a client
	// of the nodes that will form the majority.
	agentCreds := sc.startAgent("m1", 2, 3)

	apply := func(node int, version string) (string, string, int) {
		return sc.control(node, "deploy", "apply", "-f", writeManifest(t, sc.dir, version), "--drain-grace", "10ms", "--gateway-wait", "1s", "--lease-ttl", "2s")
	}
	if out, errOut, code := apply(2, "1"); code != 0 {
		t.Fatalf("first apply: %d\n%s\n%s", code, out, errOut)
	}

	// The agent's credentials: no certificates, no other machine's RPC.
	checkAgentCredentials(t, sc, agentCreds)

	// Partition s1 from s2 and s3.
	sc.lab.cut(1)
	partitioned := time.Now()
	var errOut string
	var early []string
	eventually(t, 30*time.Second, "s1 to refuse writes", func() bool {
		var code int
		_, errOut, code = sc.control(1, "machine", "invite")
		if !strings.Contains(errOut, "quorum_unavailable") {
			first, _, _ := strings.Cut(errOut, "\n")
			early = append(early, fmt.Sprintf("exit %d %s", code, first))
		}
		return strings.Contains(errOut, "quorum_unavailable")
	})
	// Before s1 notices (its RAFT peers go quiet), a write it accepts
	// cannot commit: it times out, and nothing of it survives the heal.
	t.Logf("writes on s1 before it noticed the partition: %v", early)
	t.Logf("s1 refused writes %s after the partition: %s", time.Since(partitioned).Round(time.Millisecond), strings.TrimSpace(errOut))
	refused := 0
	writes := [][]string{
		{"machine", "invite"},
		{"machine", "drain", "m1"},
		{"machine", "disable", "m1"},
		{"machine", "enable", "m1"},
		{"deploy", "apply", "-f", writeManifest(t, sc.dir, "minority")},
		{"deploy", "rollback", "shop"},
	}
	for _, w := range writes {
		start := time.Now()
		_, e, code := sc.control(1, append(w, "-o", "json")...)
		var got struct{ Error store.Error }
		if code != 1 || json.Unmarshal([]byte(e), &got) != nil || got.Error.Code != store.CodeQuorumUnavailable {
			t.Fatalf("control %v on the minority: exit %d\n%s", w, code, e)
		}
		if !strings.Contains(got.Error.Detail["missing"], "s2") || !strings.Contains(got.Error.Detail["missing"], "s3") {
			t.Fatalf("control %v: the error must name s2 and s3: %+v", w, got.Error)
		}
		if el := time.Since(start); el > 6*time.Second {
			t.Fatalf("control %v took %s to refuse", w, el)
		}
		refused++
	}
	// A lease straight through the store API is refused the same way.
	// (Binding the store may already be refused: some stream leaders are
	// out of reach.)
	nc1, err := store.Connect(store.ConnectOptions{URL: sc.url(1), CredsFile: sc.creds, Name: "lease probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc1.Close()
	octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
	defer ocancel()
	s1, err := store.Open(octx, nc1, sc.names)
	if err == nil {
		_, err = s1.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "t"})
		if !store.HasCode(err, store.CodeQuorumUnavailable) {
			t.Fatalf("lease on the minority: %v", err)
		}
	} else if !store.HasCode(err, store.CodeQuorumUnavailable) && !store.HasCode(err, store.CodeUnavailable) {
		t.Fatalf("binding the store on the minority: %v", err)
	}
	refused++

	// The majority commits (once it has elected leaders for what s1 led).
	var committed []string
	for _, v := range []string{"2", "3"} {
		var out, e string
		eventually(t, 40*time.Second, "the majority to commit v"+v, func() bool {
			var code int
			out, e, code = apply(2, v)
			// While the majority elects leaders for what s1 led, an
			// attempt may fail as unavailable, or find the lease of an
			// attempt whose release could not be written (it expires).
			if code != 0 && !strings.Contains(e, "unavailable") && !strings.Contains(e, "busy") {
				t.Fatalf("apply v%s on the majority: %d\n%s\n%s", v, code, out, e)
			}
			return code == 0
		})
		committed = append(committed, v)
	}
	s2 := sc.open(2, sc.creds)
	idsDuring := finalCommitIDs(t, s2)

	// Heal; s1 catches up, and every node's replica of every stream agrees.
	sc.lab.heal(1)
	eventually(t, 60*time.Second, "s1 to accept writes again", func() bool {
		_, _, code := sc.control(1, "machine", "invite")
		return code == 0
	})
	var answers []store.StorageNodeStatus
	eventually(t, 60*time.Second, "all replicas to agree", func() bool {
		var err error
		answers, err = store.GatherStorageStatus(ctx, s2.NC, sc.names, 2*time.Second)
		if err != nil || len(answers) != 3 {
			return false
		}
		return replicasAgree(answers, sc.names.DeployCommitsStream()) && replicasAgree(answers, "KV_"+sc.names.MachinesBucket())
	})
	for _, a := range answers {
		for _, st := range a.Streams {
			if st.Name == sc.names.DeployCommitsStream() {
				t.Logf("node %s: commits replica msgs=%d bytes=%d last_seq=%d", a.Server, st.Msgs, st.Bytes, st.LastSeq)
			}
		}
	}
	// Read through s1 now: nothing committed by the majority is missing,
	// and the minority added nothing.
	// Right after healing, s1's rejoin can set off a new JetStream meta
	// election: reads answer 503 (unavailable) until a leader is back, so
	// wait for one.
	s1Again := sc.open(1, sc.creds)
	var idsAfter []string
	var transient []string
	readStart := time.Now()
	eventually(t, 30*time.Second, "the commits to be readable through s1", func() bool {
		var err error
		idsAfter, err = readFinalCommitIDs(s1Again)
		if err != nil && !store.HasCode(err, store.CodeQuorumUnavailable) && !store.HasCode(err, store.CodeUnavailable) {
			t.Fatalf("reading commits through s1: %v", err)
		}
		if err != nil && len(transient) < 3 {
			transient = append(transient, err.Error())
		}
		return err == nil
	})
	if len(transient) > 0 {
		t.Logf("reads through s1 after healing were unavailable for %s: %v", time.Since(readStart).Round(time.Millisecond), transient)
	}
	if strings.Join(idsAfter, ",") != strings.Join(idsDuring, ",") || len(idsAfter) != 1+len(committed) {
		t.Fatalf("final commits diverged or were lost: during partition (majority) %v, after healing (via s1) %v", idsDuring, idsAfter)
	}
	ls, _, code := sc.control(1, "storage", "ls")
	if code != 0 || !strings.Contains(ls, "write quorum: ok") {
		t.Fatalf("storage ls after healing:\n%s", ls)
	}
	t.Logf("minority writes refused: %d; majority commits: %d; commits lost: 0 (%d final commits on all 3 replicas)\n%s",
		refused, len(committed), len(idsAfter), ls)
}

// replicasAgree reports whether every node's local replica of stream has the
// same message count, size and last sequence.
func replicasAgree(answers []store.StorageNodeStatus, stream string) bool {
	var first *store.StreamReplica
	for _, a := range answers {
		var mine *store.StreamReplica
		for i := range a.Streams {
			if a.Streams[i].Name == stream {
				mine = &a.Streams[i]
			}
		}
		if mine == nil {
			return false
		}
		if first == nil {
			first = mine
			continue
		}
		if mine.Msgs != first.Msgs || mine.Bytes != first.Bytes || mine.LastSeq != first.LastSeq {
			return false
		}
	}
	return first != nil
}

// checkAgentCredentials: agent m1's credentials cannot read certificates,
// cannot answer machine m2's RPCs, and cannot write another machine's record.
func checkAgentCredentials(t *testing.T, sc *storageCluster, agentCreds string) {
	t.Helper()
	ctx := context.Background()
	ctl := sc.open(2, sc.creds)
	ctlCerts := storetest.Bucket(t, ctl, ctl.Names.CertsBucket())
	if _, err := ctlCerts.Put(ctx, "shop.example.com.key", []byte("-----BEGIN PRIVATE KEY-----")); err != nil {
		t.Fatal(err)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: sc.url(2), CredsFile: agentCreds, Name: "agent creds probe"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	perms := make(chan error, 8)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { perms <- err })
	as, err := store.Open(ctx, nc, sc.names)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	asCerts := storetest.Bucket(t, as, as.Names.CertsBucket())
	if ent, err := asCerts.Get(cctx, "shop.example.com.key"); err == nil {
		t.Fatalf("agent credentials read a private key: %q", ent.Value())
	}
	if _, err := as.JS.OrderedConsumer(cctx, "KV_"+sc.names.CertsBucket(), jetstream.OrderedConsumerConfig{}); err == nil {
		t.Fatal("agent credentials created a consumer on the certificates bucket")
	}
	if _, err := nc.Subscribe(sc.names.NodeListenSubject("m2"), func(m *nats.Msg) { _ = m.Respond([]byte(`{"result":"hijacked"}`)) }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-perms:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("m2 subscription: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("agent m1's credentials subscribed to m2's RPC subject")
	}
	c2, cancel2 := context.WithTimeout(ctx, time.Second)
	defer cancel2()
	if err := ctl.Call(c2, "m2", store.CmdCapacity, store.CapacityRequest{}, nil); !store.HasCode(err, store.CodeRPCFailure) {
		t.Fatalf("a call to m2 was answered: %v", err)
	}
	// It cannot write another machine's instance records (keys name the
	// machine), though its own agent process writes m1's.
	key := store.InstanceKey("shop", "m2", "web-0-forged")
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	wrote := make(chan error, 1)
	asInstances := storetest.Bucket(t, as, as.Names.InstancesBucket())
	go func() {
		_, err := asInstances.Put(wctx, key, []byte(`{"version":1,"machine":"m2","state":"ready"}`))
		wrote <- err
	}()
	for refused := false; !refused; {
		select {
		case err := <-perms:
			refused = strings.Contains(err.Error(), "Permissions Violation") && strings.Contains(err.Error(), "."+key+`"`)
		case err := <-wrote:
			t.Fatalf("agent m1's write of m2's instance record: %v (want a permissions violation)", err)
		}
	}
	wcancel()
	ctlInstances := storetest.Bucket(t, ctl, ctl.Names.InstancesBucket())
	if _, err := ctlInstances.Get(ctx, key); err == nil {
		t.Fatal("agent m1's write of m2's instance record landed")
	}
	own := 0
	if err := store.ListJSON(ctx, ctl, ctlInstances, store.NamespaceInstancesFilter("shop"), func(k string, r *store.InstanceRecord) error {
		if r.Machine == "m1" && k == r.Key() {
			own++
		}
		return nil
	}); err != nil || own == 0 {
		t.Fatalf("agent m1 wrote none of its own instance records under its machine's keys: %v", err)
	}
	// Its own machine answers (the real agent process, same credentials).
	var rep store.CapacityReply
	if err := ctl.Call(ctx, "m1", store.CmdCapacity, store.CapacityRequest{}, &rep); err != nil || rep.Machine != "m1" {
		t.Fatalf("m1's own RPC: %+v %v", rep, err)
	}
}
