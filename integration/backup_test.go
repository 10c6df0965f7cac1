package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// loadManifest is a namespace of its own, redeployed while a backup runs.
const loadManifest = `
namespace: load
services:
  web:
    command: ["@HELLO@"]
    env: {VERSION: "%d"}
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [load.example.com]}]
`

// servedRoute is what a gateway's /edgeplane/routes says of one service,
// without its judgement of the moment (set-aside endpoints).
type servedRoute struct {
	Namespace string           `json:"namespace"`
	Service   string           `json:"service"`
	DeployID  string           `json:"deploy_id"`
	Revision  int64            `json:"revision"`
	Routes    []store.Route    `json:"routes"`
	Endpoints []store.Endpoint `json:"endpoints"`
}

// servedRoutes is the routing gw serves for namespace ns.
func servedRoutes(t *testing.T, gw *gateway, ns string) []servedRoute {
	t.Helper()
	var all []servedRoute
	if err := json.Unmarshal([]byte(routesOf(t, gw)), &all); err != nil {
		t.Fatal(err)
	}
	var out []servedRoute
	for _, r := range all {
		if r.Namespace == ns {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b servedRoute) int { return strings.Compare(a.Service, b.Service) })
	return out
}

// An encrypted box is backed up while deploys go on; its store is
// destroyed; a truncated backup is refused by a fresh server with nothing
// written; the backup is restored; and a gateway started on the restored
// store serves exactly the routing it served before.
func TestBackupDestroyRestoreServesTheSameRouting(t *testing.T) {
	buildExtra(t)
	keyFile := filepath.Join(t.TempDir(), "jetstream.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString([]byte(rand.Text()))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newAuthCluster(t, "--encrypt", "on", "--store-key", keyFile)
	c.join("m1")
	gw := startEdgeGateway(t, c, "gw1", c.url, c.issueCreds(storagenode.RoleGateway, "gw1"))
	c.mustControl(applyArgs(c.manifest("shop.yaml", helloV1), "--gateway-wait", "10s")...)
	_, shopIDs := liveIDs(t, c, "shop")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool { return servesOnly(gw, "shop.example.com", shopIDs, 5) })
	before := servedRoutes(t, gw, "shop")
	if len(before) != 2 {
		t.Fatalf("shop's routes before the backup: %+v", before)
	}

	// Deploys go on while the backup is taken.
	stop := make(chan struct{})
	var applied, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for v := 1; ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			file := c.manifest(fmt.Sprintf("load%d.yaml", v), fmt.Sprintf(loadManifest, v))
			if _, _, code := c.control(applyArgs(file, "--gateway-wait", "10s")...); code == 0 {
				applied.Add(1)
			} else {
				failed.Add(1)
			}
		}
	})
	eventually(t, 30*time.Second, "a first deploy of the load namespace", func() bool { return applied.Load() > 0 })
	backup := filepath.Join(t.TempDir(), "box.backup")
	t0 := time.Now()
	out := c.mustControl("storage", "backup", backup, "--store-key", keyFile)
	took := time.Since(t0)
	during := applied.Load()
	close(stop)
	wg.Wait()
	t.Logf("backup in %s with deploys going on (%d applied before it ended, %d in all, %d failed): %s", took, during, applied.Load(), failed.Load(), out)
	if !strings.Contains(out, "encrypted with a key derived from the store key") || failed.Load() != 0 {
		t.Fatalf("backup: %s; %d deploys failed", out, failed.Load())
	}

	// The store is destroyed; the box starts again on an empty one.
	gw.proc.stop(syscall.SIGTERM)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(c.url, "nats://"))
	c.server.stop(syscall.SIGTERM)
	if err := os.RemoveAll(filepath.Join(c.serverDir(), "jetstream")); err != nil {
		t.Fatal(err)
	}
	c.startServer("127.0.0.1:" + port)
	commitsNow := func() uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ci, err := c.store.StreamInfo(ctx, c.store.Names.DeployCommitsStream())
		if err != nil {
			t.Fatal(err)
		}
		return ci.State.LastSeq
	}
	if n := commitsNow(); n != 0 {
		t.Fatalf("the destroyed store holds %d commits", n)
	}

	// A truncated copy is refused, and nothing is written.
	raw, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.backup")
	if err := os.WriteFile(cut, raw[:len(raw)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := c.control("storage", "restore", cut, "--store-key", keyFile); code == 0 ||
		!strings.Contains(errOut, "nothing was written") || !strings.Contains(errOut, "truncated") {
		t.Fatalf("restoring a truncated backup: exit %d\n%s%s", code, out, errOut)
	}
	if n := commitsNow(); n != 0 {
		t.Fatalf("the refused restore wrote %d commits", n)
	}

	t0 = time.Now()
	out = c.mustControl("storage", "restore", backup, "--store-key", keyFile)
	t.Logf("restore in %s: %s", time.Since(t0), out)
	if n := commitsNow(); n == 0 {
		t.Fatal("the restore brought back no commits")
	}
	// As the restore says: the server starts again on the restored store.
	c.server.stop(syscall.SIGTERM)
	c.startServer("127.0.0.1:" + port)

	gw2 := startEdgeGateway(t, c, "gw2", c.url, c.issueCreds(storagenode.RoleGateway, "gw2"))
	eventually(t, 20*time.Second, "the gateway on the restored store to serve shop", func() bool {
		return servesOnly(gw2, "shop.example.com", shopIDs, 5)
	})
	if after := servedRoutes(t, gw2, "shop"); !reflect.DeepEqual(after, before) {
		t.Fatalf("shop's routing after the restore:\n%+v\nbefore the backup:\n%+v", after, before)
	}
	// The restored store takes deploys again, once m1's agent is back.
	c.waitReachable("m1")
	c.mustControl(applyArgs(c.manifest("shop2.yaml", helloV2), "--gateway-wait", "10s")...)
}

// Snapshots and restores are the control role's: an edge box's stolen
// agent, gateway or meshd credentials are refused both, under the
// JetStream API and the edge account's prefix alike.
func attackBackups(t *testing.T, f *attackFixture) {
	stream := f.c.store.Names.DeployCommitsStream()
	for _, creds := range []string{f.agentCreds, f.gwCreds, f.meshCreds} {
		th := f.as(t, creds)
		for _, prefix := range []string{"$JS.API", store.EdgeAPIPrefix} {
			snap := prefix + ".STREAM.SNAPSHOT." + stream
			th.try(t, filepath.Base(creds)+" snapshot via "+prefix, func(ctx context.Context) error {
				deliver := th.nc.NewInbox()
				sub, err := th.nc.SubscribeSync(deliver)
				if err != nil {
					return err
				}
				defer sub.Unsubscribe()
				return jsRefused(ctx, th.nc, snap, fmt.Sprintf(`{"deliver_subject":%q}`, deliver))
			})
			restore := prefix + ".STREAM.RESTORE.stolen"
			th.try(t, filepath.Base(creds)+" restore via "+prefix, func(ctx context.Context) error {
				return jsRefused(ctx, th.nc, restore, `{"config":{"name":"stolen","subjects":["stolen.>"]},"state":{}}`)
			})
		}
	}
}

// jsRefused sends a JetStream API request and returns nil only when the
// server answered it without an error: an error answer, or none, is a
// refusal.
func jsRefused(ctx context.Context, nc *nats.Conn, subject, req string) error {
	m, err := nc.RequestWithContext(ctx, subject, []byte(req))
	if err != nil {
		return err
	}
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) != nil || resp.Error != nil {
		return fmt.Errorf("error answer: %s", m.Data)
	}
	return nil
}

// A cluster's backup comes back into a fresh cluster of three (new data
// dirs, the same auth dir): every stream at three replicas, caught up, the
// live commit and routing as they were, signed under the same root.
func TestRestoreIntoAFreshCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sc := newStorageCluster(t)
	var s *store.Store
	eventually(t, 60*time.Second, "write quorum", func() bool {
		s = sc.open(1, sc.creds)
		return s.RequireQuorum(ctx) == nil
	})
	svc := storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
		Instances: []storetest.Instance{{ID: "web-0", Machine: "m1", Address: "127.0.0.1", Port: 9001}, {ID: "web-1", Machine: "m1", Address: "127.0.0.1", Port: 9002}}}
	for range 3 {
		if _, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{"web": svc}); err != nil {
			t.Fatal(err)
		}
	}
	live, err := s.LiveCommit(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "cluster.backup")
	// The nodes encrypt the store at rest with the key in the auth dir:
	// the backup is sealed with it.
	keyFile := filepath.Join(sc.dir, "auth", storagenode.StoreKeyCredential)
	if out, e, code := sc.control(1, "storage", "backup", backup, "--store-key", keyFile); code != 0 || !strings.Contains(out, "encrypted with a key derived") {
		t.Fatalf("backup: %d\n%s%s", code, out, e)
	}

	// A fresh cluster on the same addresses and auth dir.
	for _, p := range sc.servers {
		p.stop(syscall.SIGTERM)
	}
	sc.servers = nil
	for i := 1; i <= 3; i++ {
		sc.servers = append(sc.servers, sc.startNodeNamed(i, fmt.Sprintf("t%d", i), " (fresh)"))
	}
	for _, p := range sc.servers {
		p.waitOutput(t, `control server ready`, 90*time.Second)
	}
	t0 := time.Now()
	out, e, code := sc.control(2, "storage", "restore", backup, "--store-key", keyFile)
	if code != 0 {
		t.Fatalf("restore: %d\n%s%s", code, out, e)
	}
	t.Logf("restore into three nodes in %s:\n%s", time.Since(t0).Round(time.Millisecond), out)

	r := sc.open(3, sc.creds)
	ci, err := r.StreamInfo(ctx, r.Names.DeployCommitsStream())
	if err != nil || ci.Config.Replicas != 3 || ci.Cluster == nil || len(ci.Cluster.Replicas) != 2 {
		t.Fatalf("restored commits: %+v, %v", ci, err)
	}
	got, err := r.LiveCommit(ctx, "shop")
	if err != nil || got.ID != live.ID {
		t.Fatalf("live commit after the restore: %+v, %v; was %s", got, err, live.ID)
	}
	rs, err := r.LoadRouting(ctx)
	if err != nil || len(rs.Services) != 1 || len(rs.Skipped) != 0 {
		t.Fatalf("routing after the restore: %+v, %v", rs, err)
	}
}
