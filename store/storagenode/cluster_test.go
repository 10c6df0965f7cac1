package storagenode_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

type testNode struct {
	name string
	dir  string
	ns   *server.Server
	nc   *nats.Conn
}

// startCluster starts three clustered storage nodes in this process, each
// answering the storage status subject as `control server` does.
func startCluster(t *testing.T, auth *storagenode.Auth) []*testNode {
	t.Helper()
	ports := freePorts(t, 3)
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", p))
	}
	secret := ""
	if auth != nil {
		secret = auth.ClusterSecret
	}
	nodes := make([]*testNode, 3)
	for i := range nodes {
		name := fmt.Sprintf("s%d", i+1)
		dir := t.TempDir()
		ns, err := storagenode.Start(storagenode.Config{
			DataDir: dir, Listen: "127.0.0.1:0", ServerName: name, Auth: auth,
			Cluster: &storagenode.ClusterConfig{Name: "edge", Listen: routes[i], Routes: routes, Secret: secret},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		nodes[i] = &testNode{name: name, dir: dir, ns: ns}
	}
	return nodes
}

func TestClusterQuorumLossNamesMissingNodes(t *testing.T) {
	nodes := startCluster(t, nil)
	names, _ := store.NewNames("", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range nodes {
		nc, err := store.Connect(store.ConnectOptions{URL: n.ns.ClientURL(), ReconnectForever: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		n.nc = nc
		stop, err := storagenode.ServeStatus(ctx, nc, names, n.ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	if err := store.WaitForJetStream(ctx, nodes[0].nc); err != nil {
		t.Fatal(err)
	}
	var s *store.Store
	storetest.Eventually(t, 30*time.Second, "provisioning R3", func() bool {
		var err error
		s, err = store.Provision(ctx, nodes[0].nc, names, store.Layout{Replicas: 3})
		return err == nil
	})
	if err := s.RequireQuorum(ctx); err != nil {
		t.Fatalf("healthy cluster: %v", err)
	}
	pl, err := s.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pl {
		if p.Replicas != 3 || len(p.Peers) != 3 {
			t.Fatalf("stream %s: %+v", p.Stream, p)
		}
	}
	// Provisioning again (a storage node restarting with another layout)
	// changes no replica count: only `control storage add|remove` does.
	if _, err := store.Provision(ctx, nodes[0].nc, names, store.Layout{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	if pl, err = s.Placement(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range pl {
		if p.Replicas != 3 {
			t.Fatalf("re-provisioning changed stream %s to %d replicas", p.Stream, p.Replicas)
		}
	}
	// One node gone: quorum holds, writes work.
	nodes[2].ns.Shutdown()
	nodes[2].ns.WaitForShutdown()
	storetest.Eventually(t, 20*time.Second, "a write with one node down", func() bool {
		_, _, err := invites.Create(ctx, s, invites.Spec{TTL: time.Minute})
		return err == nil
	})
	// Two gone: the survivor refuses, naming both.
	nodes[1].ns.Shutdown()
	nodes[1].ns.WaitForShutdown()
	var qerr error
	storetest.Eventually(t, 30*time.Second, "quorum_unavailable", func() bool {
		qerr = s.RequireQuorum(ctx)
		return store.HasCode(qerr, store.CodeQuorumUnavailable)
	})
	se := store.AsError(qerr)
	if !strings.Contains(se.Detail["missing"], "s2") || !strings.Contains(se.Detail["missing"], "s3") {
		t.Fatalf("error does not name the missing nodes: %v", qerr)
	}
	start := time.Now()
	_, _, err = invites.Create(ctx, s, invites.Spec{TTL: time.Minute})
	if !store.HasCode(err, store.CodeQuorumUnavailable) {
		t.Fatalf("invite without quorum: %v", err)
	}
	_, err = s.AcquireLease(ctx, store.DeployLockKey("shop"), store.LeaseOptions{TTL: 5 * time.Second, Holder: "t"})
	if !store.HasCode(err, store.CodeQuorumUnavailable) {
		t.Fatalf("lease without quorum: %v", err)
	}
	t.Logf("refusals took %s; error: %v", time.Since(start), qerr)
}
