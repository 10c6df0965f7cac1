package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storetest"
)

type cluster struct {
	srv  *storetest.Server
	stun []string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	srv := storetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var stuns []string
	for i := 0; i < 2; i++ {
		s, err := stunserver.Listen(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stuns = append(stuns, s.Addr().String())
	}
	stop, err := registrar.Serve(ctx, srv.Store, registrar.Config{STUN: stuns, Cooldown: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return &cluster{srv: srv, stun: stuns}
}

type runningNode struct {
	*node.Node
	dir  string
	done chan error
}

// join registers a netstack node bound to loopback and runs it.
func (c *cluster) join(t *testing.T, machine string, opts ...func(*node.Config)) *runningNode {
	t.Helper()
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, c.srv.Store, invites.Spec{Region: "test", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), machine)
	st, err := node.Join(ctx, node.JoinOptions{Token: tok, DataDir: dir, NATSURL: c.srv.URL, Machine: machine,
		ListenPort: 0, Bind: "127.0.0.1", Mode: node.ModeNetstack})
	if err != nil {
		t.Fatalf("join %s: %v", machine, err)
	}
	if !netip.MustParsePrefix(store.MeshSubnet).Contains(netip.MustParseAddr(st.MeshIP)) {
		t.Fatalf("mesh ip %s outside %s", st.MeshIP, store.MeshSubnet)
	}
	return startNode(t, dir, opts...)
}

func startNode(t *testing.T, dir string, opts ...func(*node.Config)) *runningNode {
	t.Helper()
	cfg := node.Config{DataDir: dir, HeartbeatInterval: 200 * time.Millisecond,
		ReconcileInterval: 300 * time.Millisecond, STUNInterval: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rn := &runningNode{Node: n, dir: dir, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { rn.done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-rn.done
	})
	select {
	case <-n.Ready():
	case err := <-rn.done:
		t.Fatalf("node %s: %v", dir, err)
	case <-time.After(10 * time.Second):
		t.Fatal("node not ready")
	}
	return rn
}

func (r *runningNode) status(t *testing.T) *node.Status {
	t.Helper()
	s, err := node.QueryStatus(context.Background(), r.dir)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return s
}

func (r *runningNode) peer(t *testing.T, machine string) (node.PeerStatus, bool) {
	for _, p := range r.status(t).Peers {
		if p.Machine == machine {
			return p, true
		}
	}
	return node.PeerStatus{}, false
}

// TestNetstackMesh runs two meshd nodes in userspace (no root): they join,
// discover their endpoint with STUN over the WireGuard socket, carry an HTTP
// request over the mesh, report drift, and a leaving node disappears from
// the other's config.
func TestNetstackMesh(t *testing.T) {
	c := startCluster(t)
	a := c.join(t, "alpha")
	metricsAddr := freeLoopbackAddr(t)
	b := c.join(t, "beta", func(cfg *node.Config) { cfg.MetricsAddr = metricsAddr })
	ipA := netip.MustParseAddr(a.State().MeshIP)
	if a.State().MeshIP == b.State().MeshIP {
		t.Fatalf("both nodes got %s", a.State().MeshIP)
	}

	ln, err := a.Net().ListenTCPAddrPort(netip.AddrPortFrom(ipA, 80))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from alpha to %s", r.RemoteAddr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return b.Net().DialContextTCPAddrPort(ctx, netip.MustParseAddrPort(addr))
		}}}
	var body string
	storetest.Eventually(t, 20*time.Second, "HTTP over the mesh from beta to alpha", func() bool {
		resp, err := client.Get("http://" + netip.AddrPortFrom(ipA, 80).String() + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		bb, _ := io.ReadAll(resp.Body)
		body = string(bb)
		return resp.StatusCode == 200
	})
	if want := "hello from alpha to " + b.State().MeshIP; len(body) < len(want) || body[:len(want)] != want {
		t.Fatalf("body %q, want prefix %q", body, want)
	}

	storetest.Eventually(t, 10*time.Second, "STUN mapping of the WireGuard port", func() bool {
		s := a.status(t)
		return s.NAT.Type == node.NATOpen && s.NAT.Endpoint == fmt.Sprintf("127.0.0.1:%d", s.ListenPort)
	})
	storetest.Eventually(t, 10*time.Second, "drift report in sync", func() bool {
		var rep store.MeshDriftReport
		_, err := store.GetJSON(context.Background(), storetest.Bucket(t, c.srv.Store, c.srv.Store.Names.MeshDriftBucket()), store.MeshDriftKey("alpha"), &rep)
		return err == nil && rep.InSync && rep.Source == "watch"
	})
	p, ok := b.peer(t, "alpha")
	if !ok || !p.Active || p.Liveness != store.LivenessAlive || p.LastHandshake.IsZero() {
		t.Fatalf("beta's view of alpha: %+v (found %v)", p, ok)
	}
	// The pair's preshared key, on both ends.
	bothEnds(t, a, b, "the tunnel to use the pair's preshared key", func(n *runningNode, other string) bool {
		p, ok := n.peer(t, other)
		return ok && p.PSK && n.status(t).Control.PSKReady
	})
	// Beta's Prometheus metrics tell the same.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, re := range []string{`meshd_peers\{state="active"\} 1\n`, `meshd_heartbeats_total\{result="ok"\} [1-9]`,
		`meshd_reconciles_total [1-9]`, `meshd_peer_handshake_age_seconds\{peer="alpha"\} `, `meshd_peer_rx_bytes\{peer="alpha"\} [1-9]`,
		`meshd_watch_restarts_total 0\n`, `meshd_full_state_polls_total 0\n`} {
		if !regexp.MustCompile(re).Match(metrics) {
			t.Errorf("beta's metrics lack %s:\n%s", re, metrics)
		}
	}

	// Leave: alpha's record goes, beta drops it from its device.
	rep, err := node.Leave(context.Background(), node.LeaveOptions{DataDir: a.dir})
	if err != nil {
		t.Fatalf("leave: %v", err)
	}
	if rep.ReleasedIP != ipA.String() {
		t.Fatalf("released %s, want %s", rep.ReleasedIP, ipA)
	}
	storetest.Eventually(t, 10*time.Second, "alpha gone from beta's config", func() bool {
		_, ok := b.peer(t, "alpha")
		return !ok
	})
	if err := <-a.done; err != nil {
		t.Fatalf("alpha run after leave: %v", err)
	}
	a.done <- nil // for the cleanup
	if _, err := node.LoadState(a.dir); err != node.ErrNotJoined {
		t.Fatalf("state after leave: %v", err)
	}
}

// TestOfflineRestartFromCache restarts a node while NATS is down: it brings
// its tunnel back from the cached peers.
func TestOfflineRestartFromCache(t *testing.T) {
	c := startCluster(t)
	a := c.join(t, "alpha")
	b := c.join(t, "beta")
	// Both watches are live and both caches hold the other node.
	for _, x := range []struct {
		n     *runningNode
		other string
	}{{a, "beta"}, {b, "alpha"}} {
		storetest.Eventually(t, 10*time.Second, x.other+" known from the watch", func() bool {
			p, ok := x.n.peer(t, x.other)
			return ok && p.Active && x.n.status(t).Control.Watch == "live"
		})
		storetest.Eventually(t, 10*time.Second, "peer cache holds "+x.other, func() bool {
			b, err := os.ReadFile(filepath.Join(x.n.dir, "peers.json"))
			return err == nil && strings.Contains(string(b), `"`+x.other+`"`)
		})
	}
	// Both use the pair's preshared key, and keep it in the cache.
	bothEnds(t, a, b, "the preshared key in use and cached", func(n *runningNode, other string) bool {
		p, ok := n.peer(t, other)
		b, err := os.ReadFile(filepath.Join(n.dir, "peers.json"))
		return ok && p.PSK && err == nil && strings.Contains(string(b), `"psks"`)
	})
	// A full reconcile has saved the cache once beta is known.
	c.srv.NATS.Shutdown()
	c.srv.NATS.WaitForShutdown()

	// Stop alpha and start it again with the control plane gone.
	a.Shutdown()
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
	a.done <- nil
	a2 := startNode(t, a.dir)
	s := a2.status(t)
	if s.Control.Source != "cache" || s.Control.Connected {
		t.Fatalf("restarted node control view: %+v", s.Control)
	}
	ipB := netip.MustParseAddr(b.State().MeshIP)
	servePong(t, b, ipB)
	t.Cleanup(func() {
		if t.Failed() {
			js, _ := json.Marshal(a2.status(t))
			t.Logf("alpha2: %s", js)
			js, _ = json.Marshal(b.status(t))
			t.Logf("beta: %s", js)
		}
	})
	// The restarted node's first handshake uses the cached key: beta,
	// holding the same, accepts it.
	if p, ok := a2.peer(t, "beta"); !ok || !p.PSK {
		t.Fatalf("restarted alpha's beta: %+v (found %v)", p, ok)
	}
	storetest.Eventually(t, 20*time.Second, "TCP from restarted alpha to beta without NATS", func() bool {
		return pongs(context.Background(), a2, ipB)
	})
}

// bothEnds waits until cond holds on alpha about beta and on beta about
// alpha.
func bothEnds(t *testing.T, a, b *runningNode, what string, cond func(n *runningNode, other string) bool) {
	t.Helper()
	for _, x := range []struct {
		n     *runningNode
		other string
	}{{a, "beta"}, {b, "alpha"}} {
		storetest.Eventually(t, 10*time.Second, x.other+": "+what, func() bool { return cond(x.n, x.other) })
	}
}

// pongPort is where servePong listens on a node's mesh IP.
const pongPort = 7000

// servePong answers "pong" to every TCP connection to ip:pongPort on n's
// userspace network until the test ends.
func servePong(t *testing.T, n *runningNode, ip netip.Addr) {
	t.Helper()
	ln, err := n.Net().ListenTCPAddrPort(netip.AddrPortFrom(ip, pongPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("pong"))
			conn.Close()
		}
	}()
}

// pongs reports whether from reaches servePong at ip over the mesh within a
// second.
func pongs(ctx context.Context, from *runningNode, ip netip.Addr) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := from.Net().DialContextTCPAddrPort(ctx, netip.AddrPortFrom(ip, pongPort))
	if err != nil {
		return false
	}
	defer conn.Close()
	buf, _ := io.ReadAll(conn)
	return string(buf) == "pong"
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Peer records are the control plane's, signed by the registrar: one
// written by anyone else (here the NATS account itself) neither replaces a
// peer's key and endpoints nor removes the peer, and the node says so in
// its status and metrics.
func TestForgedPeerRecordsAreRefused(t *testing.T) {
	c := startCluster(t)
	a := c.join(t, "alpha")
	metricsAddr := freeLoopbackAddr(t)
	b := c.join(t, "beta", func(cfg *node.Config) { cfg.MetricsAddr, cfg.ReconcileInterval = metricsAddr, 200*time.Millisecond })
	var genuine node.PeerStatus
	storetest.Eventually(t, 10*time.Second, "beta to know alpha", func() bool {
		var ok bool
		genuine, ok = b.peer(t, "alpha")
		return ok && genuine.Active
	})
	ctx := context.Background()
	s := c.srv.Store
	subj := "$KV." + s.Names.MeshPeersBucket() + "." + store.MeshPeerKey("alpha")
	forged, _ := json.Marshal(store.MeshPeerRecord{Version: 1, Machine: "alpha", PublicKey: "bm90IGFscGhhJ3Mga2V5IGF0IGFsbCBub3QgYXQgYWxsIQ==",
		MeshIP: a.State().MeshIP, Endpoints: []string{"203.0.113.9:51820"}})
	put := nats.NewMsg(subj)
	put.Data = forged
	del := nats.NewMsg(subj)
	del.Header.Set("KV-Operation", "DEL")
	for _, m := range []*nats.Msg{put, del} {
		if _, err := s.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	storetest.Eventually(t, 10*time.Second, "beta to refuse both", func() bool {
		return b.status(t).Control.RefusedRecords >= 2
	})
	st := b.status(t)
	if !strings.Contains(st.Control.LastRefusal, "mesh peer record peer.alpha") || st.Control.TrustRoot == "" {
		t.Fatalf("status: %+v", st.Control)
	}
	if p, ok := b.peer(t, "alpha"); !ok || p.PublicKey != genuine.PublicKey {
		t.Fatalf("alpha after the forged records: %+v (found %v), was %+v", p, ok, genuine)
	}
	// The full reads the watch makes every reconcile interval keep the
	// last good record too.
	refusedAt := time.Now()
	storetest.Eventually(t, 10*time.Second, "a full read after the refusals", func() bool {
		return b.status(t).Control.LastSync.After(refusedAt)
	})
	if p, ok := b.peer(t, "alpha"); !ok || p.PublicKey != genuine.PublicKey {
		t.Fatalf("alpha after a full read: %+v (found %v)", p, ok)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`meshd_peer_records_refused_total\{reason="unsigned"\} [2-9]`).Match(metrics) {
		t.Errorf("metrics lack the refusals:\n%s", metrics)
	}
}

// A meshd of a generation below the store's floor refuses to run, naming
// the release the store needs.
func TestNodeRefusesAStoreAboveItsGeneration(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	tok, _, err := invites.Create(ctx, c.srv.Store, invites.Spec{Region: "test", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "m1")
	if _, err := node.Join(ctx, node.JoinOptions{Token: tok, DataDir: dir, NATSURL: c.srv.URL, Machine: "m1",
		ListenPort: 0, Bind: "127.0.0.1", Mode: node.ModeNetstack}); err != nil {
		t.Fatal(err)
	}
	storetest.FutureFloor(t, c.srv.Store, 99, "9.0.0")
	n, err := node.New(node.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n.Run(rctx); !store.HasCode(err, store.CodeTooOld) || !strings.Contains(err.Error(), "9.0.0") {
		t.Fatalf("Run on a floor of generation 99: %v, want too_old naming 9.0.0", err)
	}
}
