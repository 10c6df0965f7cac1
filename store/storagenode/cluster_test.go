package storagenode_test

import (
	"context"
	"errors"
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
	secret := ""
	if auth != nil {
		secret = auth.ClusterSecret
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	servers := startOnFreePorts(t, func(i int, routes []string) storagenode.Config {
		return storagenode.Config{
			DataDir: dirs[i], Listen: "127.0.0.1:0", ServerName: fmt.Sprintf("s%d", i+1), Auth: auth,
			Cluster: &storagenode.ClusterConfig{Name: "edge", Listen: routes[i], Routes: routes, Secret: secret},
		}
	})
	nodes := make([]*testNode, 3)
	for i, ns := range servers {
		nodes[i] = &testNode{name: fmt.Sprintf("s%d", i+1), dir: dirs[i], ns: ns}
	}
	return nodes
}

// startOnFreePorts starts three clustered nodes, configured by cfg from
// their index and the route addresses of all three, shut down when the
// test ends. The ports were free when picked, but another process may
// take one before its node listens: the node then fails to start
// (storagenode.ErrCannotStart), and all three start again on new ports.
func startOnFreePorts(t *testing.T, cfg func(i int, routes []string) storagenode.Config) []*server.Server {
	t.Helper()
	for attempt := 1; ; attempt++ {
		var routes []string
		for _, p := range freePorts(t, 3) {
			routes = append(routes, fmt.Sprintf("127.0.0.1:%d", p))
		}
		nodes := make([]*server.Server, 0, 3)
		var err error
		for i := range 3 {
			var ns *server.Server
			if ns, err = storagenode.Start(cfg(i, routes)); err != nil {
				break
			}
			nodes = append(nodes, ns)
		}
		if err == nil {
			t.Cleanup(func() {
				for _, ns := range nodes {
					ns.Shutdown()
					ns.WaitForShutdown()
				}
			})
			return nodes
		}
		for _, ns := range nodes {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		if !errors.Is(err, storagenode.ErrCannotStart) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; again on other ports", attempt, err)
	}
}

// A node whose route port is taken fails to start at once, saying why,
// rather than waiting out its ready timeout.
func TestTakenRoutePortFailsAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	_, err = storagenode.Start(storagenode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", ServerName: "s1",
		Cluster: &storagenode.ClusterConfig{Name: "edge", Listen: l.Addr().String(), Routes: []string{l.Addr().String()}}})
	if !errors.Is(err, storagenode.ErrCannotStart) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start on a taken route port: %v", err)
	}
	if took := time.Since(start); took > storagenode.DefaultReadyTimeout/2 {
		t.Errorf("failing took %s", took)
	}
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
