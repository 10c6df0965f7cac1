package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// echoServer is a TCP instance: it greets each connection with its name
// and a newline, then echoes what it reads.
type echoServer struct {
	name string
	host string
	port int
	mu   sync.Mutex
	n    int // connections accepted
}

func newEchoServer(t testing.TB, name, ip string) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	e := &echoServer{name: name, host: ip, port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.n++
			e.mu.Unlock()
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return e
}

func (e *echoServer) accepted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *echoServer) instance(machine string) storetest.Instance {
	return storetest.Instance{ID: e.name, Machine: machine, Address: e.host, Port: e.port}
}

// udpEcho is a UDP instance answering each datagram with "name:payload".
func udpEcho(t testing.TB, name string) *echoServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 9000)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name+":"+string(buf[:n])), addr)
		}
	}()
	return &echoServer{name: name, host: "127.0.0.1", port: pc.LocalAddr().(*net.UDPAddr).Port}
}

// freePort is a port nothing listens on now, for proto.
func freePort(t testing.TB, proto string) int {
	t.Helper()
	if proto == store.ProtoUDP {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		return pc.LocalAddr().(*net.UDPAddr).Port
	}
	_, p, _ := net.SplitHostPort(freeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

func l4svc(tcp, udp []int, instances ...storetest.Instance) storetest.Service {
	s := storetest.Service{Instances: instances}
	for _, p := range tcp {
		s.Layer4.TCP = append(s.Layer4.TCP, store.L4Port{Port: p})
	}
	for _, p := range udp {
		s.Layer4.UDP = append(s.Layer4.UDP, store.L4Port{Port: p})
	}
	return s
}

// l4conn is a client connection through a gateway port.
type l4conn struct {
	net.Conn
	r *bufio.Reader
	// greeting is the instance's name it was proxied to.
	greeting string
}

// dialPort connects to the gateway's port and reads the instance's
// greeting, waiting for the port to open.
func dialPort(t testing.TB, port int) *l4conn {
	t.Helper()
	var c *l4conn
	var last error
	storetest.Eventually(t, wait, fmt.Sprintf("gateway port tcp/%d to proxy", port), func() bool {
		c, last = tryPort(port)
		return last == nil
	})
	if c == nil {
		t.Fatalf("port %d: %v", port, last)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tryPort(port int) (*l4conn, error) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return nil, err
	}
	c := &l4conn{Conn: conn, r: bufio.NewReader(conn)}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	g, err := c.r.ReadString('\n')
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.greeting = strings.TrimSuffix(g, "\n")
	return c, nil
}

// echo sends a line and reads it back.
func (c *l4conn) echo(line string) error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return nil
}

// observation is the gateway's latest observation.
func (f *fixture) observation() *store.GatewayObservation {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out *store.GatewayObservation
	if err := f.nats.Store.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
		if o.Gateway == "gw-test" {
			out = o
		}
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
	if out == nil {
		return &store.GatewayObservation{}
	}
	return out
}

func newL4Fixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.app = map[string]any{"layer4_bind": "127.0.0.1", "disable_health_checks": true}
	return f
}

// A port opens when a deploy exposes it and closes when a deploy stops
// exposing it, without a reload; another port's established connection
// flows on throughout, and a config reload keeps both the port and the
// connection.
func TestL4PortsFollowRoutingWithoutReload(t *testing.T) {
	f := newL4Fixture(t)
	db, cache := newEchoServer(t, "db-1", "127.0.0.1"), newEchoServer(t, "cache-1", "127.0.0.1")
	pdb, pcache := freePort(t, "tcp"), freePort(t, "tcp")
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"cache": l4svc([]int{pcache}, nil, cache.instance("m1")),
	}))
	loads := f.proj().Status().Loads
	cc := dialPort(t, pcache)
	if cc.greeting != "cache-1" {
		t.Fatalf("tcp/%d reached %q", pcache, cc.greeting)
	}
	if _, err := tryPort(pdb); err == nil {
		t.Fatalf("tcp/%d accepts before any service exposes it", pdb)
	}

	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"cache": l4svc([]int{pcache}, nil, cache.instance("m1")),
		"db":    l4svc([]int{pdb}, nil, db.instance("m1")),
	}))
	dc := dialPort(t, pdb)
	if dc.greeting != "db-1" {
		t.Fatalf("tcp/%d reached %q", pdb, dc.greeting)
	}
	if err := dc.echo("select 1"); err != nil {
		t.Fatal(err)
	}
	if err := cc.echo("get k"); err != nil {
		t.Fatalf("the cache connection after another port opened: %v", err)
	}

	// A reload (another health interval: the same projection) keeps the
	// ports and connections.
	f.app["health_interval"] = "2s"
	f.load()
	if err := cc.echo("after reload"); err != nil {
		t.Fatalf("the cache connection across a reload: %v", err)
	}
	if c, err := tryPort(pcache); err != nil || c.greeting != "cache-1" {
		t.Fatalf("tcp/%d after a reload: %v", pcache, err)
	} else {
		c.Close()
	}

	// db stops exposing its port: the port closes, the cache's
	// connection is untouched.
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"cache": l4svc([]int{pcache}, nil, cache.instance("m1")),
		"db":    l4svc(nil, nil, db.instance("m1")),
	}))
	storetest.Eventually(t, wait, "the db port to close", func() bool {
		c, err := tryPort(pdb)
		if c != nil {
			c.Close()
		}
		return err != nil
	})
	if err := cc.echo("still here"); err != nil {
		t.Fatalf("the cache connection after another port closed: %v", err)
	}
	if l := f.proj().Status().Loads; l != loads {
		t.Errorf("routing changes reloaded the projection (%d -> %d loads)", loads, l)
	}
	// Counted per service, in the traffic table and on /metrics.
	// A report or a scrape first counts what the connections under way
	// moved (they are spliced: the copy itself reports only at its end).
	current.Load().shared.l4.catchUp()
	l4 := current.Load().shared.traffic.of(mustService(t, f, "shop", "cache")).l4.snapshot()
	if l4 == nil || l4.Open != 1 || l4.Total < 2 || l4.BytesIn == 0 || l4.BytesOut == 0 {
		t.Errorf("cache's layer-4 counters: %+v", l4)
	}
	_, metrics := f.adminGet("/metrics")
	for _, want := range []string{
		`edgeplane_gateway_l4_connections_open{namespace="shop",service="cache"} 1`,
		`edgeplane_gateway_l4_bytes_total{direction="in",namespace="shop",service="cache"}`,
		`edgeplane_gateway_l4_connections_total{namespace="shop",service="cache"}`,
		`edgeplane_gateway_l4_connect_errors_total{namespace="shop",service="cache"} 0`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// /edgeplane/routes lists the layer-4 entry with its connections.
	_, routes := f.adminGet("/edgeplane/routes")
	var infos []RouteInfo
	if err := json.Unmarshal(routes, &infos); err != nil {
		t.Fatalf("routes: %v: %s", err, routes)
	}
	found := false
	for _, ri := range infos {
		if ri.Service == "cache" {
			found = len(ri.Layer4) == 1 && ri.Layer4[0].Entry == fmt.Sprintf("tcp/%d", pcache) && ri.Layer4[0].Open["cache-1"] == 1
		}
	}
	if !found {
		t.Errorf("/edgeplane/routes has no layer-4 entry for cache with its connection: %s", routes)
	}
}

func mustService(t *testing.T, f *fixture, ns, name string) *projection.Service {
	t.Helper()
	s, ok := f.proj().View().Service(ns, name)
	if !ok {
		t.Fatalf("no service %s/%s", ns, name)
	}
	return s
}

// UDP datagrams go through a gateway port to the instance and back, each
// client address its own flow.
func TestL4UDPEcho(t *testing.T) {
	f := newL4Fixture(t)
	// Probes on: a UDP-only service's endpoints are not probed over TCP
	// (and so never set aside for it).
	f.app = map[string]any{"layer4_bind": "127.0.0.1", "health_interval": "100ms"}
	dns := udpEcho(t, "dns-1")
	port := freePort(t, "udp")
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"dns": l4svc(nil, []int{port}, dns.instance("m1"))}))
	conn, err := net.Dial("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 100)
	storetest.Eventually(t, wait, "an answer through the udp port", func() bool {
		_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := conn.Write([]byte("q1")); err != nil {
			return false
		}
		n, err := conn.Read(buf)
		return err == nil && string(buf[:n]) == "dns-1:q1"
	})
	for i := 0; i < 20; i++ {
		msg := fmt.Sprintf("q-%d", i)
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		n, err := conn.Read(buf)
		if err != nil || string(buf[:n]) != "dns-1:"+msg {
			t.Fatalf("datagram %d: %q, %v", i, buf[:n], err)
		}
	}
	time.Sleep(300 * time.Millisecond) // probe rounds
	v := f.proj().View()
	if ri := routeInfo(current.Load(), v, mustService(t, f, "shop", "dns")); len(ri.SetAside) != 0 {
		t.Errorf("a UDP-only service's endpoint set aside: %+v", ri.SetAside)
	}
}

// A connection to an instance that left routing flows on while new
// connections go to the new instance; the observation lists the old one
// meanwhile; at the drain timeout the gateway closes the connection and
// the observation lists nothing.
func TestL4DrainKeepsOldConnectionsUntilTimeout(t *testing.T) {
	f := newL4Fixture(t)
	old, fresh := newEchoServer(t, "db-1", "127.0.0.1"), newEchoServer(t, "db-2", "127.0.0.1")
	port := freePort(t, "tcp")
	withDrain := func(s storetest.Service) storetest.Service {
		s.Layer4.DrainTimeout = store.Duration(2 * time.Second)
		return s
	}
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": withDrain(l4svc([]int{port}, nil, old.instance("m1")))}))
	c1 := dialPort(t, port)
	if c1.greeting != "db-1" {
		t.Fatalf("first connection reached %q", c1.greeting)
	}
	seq := f.deploy("shop", map[string]storetest.Service{"db": withDrain(l4svc([]int{port}, nil, fresh.instance("m1")))})
	f.waitSeq(seq)
	left := time.Now()
	c2 := dialPort(t, port)
	if c2.greeting != "db-2" {
		t.Fatalf("a connection after the redeploy reached %q", c2.greeting)
	}
	if err := c1.echo("still flowing"); err != nil {
		t.Fatalf("the old connection right after the redeploy: %v", err)
	}
	storetest.Eventually(t, wait, "the observation to list db-1 draining", func() bool {
		o := f.observation()
		return o.AppliedSeq >= seq && len(o.L4Draining) == 1 && o.L4Draining[0].Instance == "db-1" && o.L4Draining[0].Conns == 1 &&
			o.L4Draining[0].Service == "db" && o.L4Draining[0].Until.After(left)
	})
	if err := c1.echo("still flowing"); err != nil && time.Since(left) < 1500*time.Millisecond {
		t.Fatalf("the old connection during its drain: %v", err)
	}
	// Closed at the drain timeout.
	_ = c1.SetReadDeadline(time.Now().Add(wait))
	if _, err := c1.r.ReadString('\n'); err == nil {
		t.Fatal("the old connection read data after its drain")
	}
	if d := time.Since(left); d < 1500*time.Millisecond || d > 5*time.Second {
		t.Errorf("the old connection ended %s after the redeploy, want about the 2s drain timeout", d)
	}
	storetest.Eventually(t, wait, "the observation to list no drain", func() bool {
		return len(f.observation().L4Draining) == 0
	})
	if err := c2.echo("new one"); err != nil {
		t.Fatalf("the new connection: %v", err)
	}
}

// A port another process holds is reported in the observation and
// retried; the other ports serve meanwhile; once freed, it opens.
func TestL4BusyPortIsRetriedAndReported(t *testing.T) {
	f := newL4Fixture(t)
	db, cache := newEchoServer(t, "db-1", "127.0.0.1"), newEchoServer(t, "cache-1", "127.0.0.1")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := held.Addr().(*net.TCPAddr).Port
	pcache := freePort(t, "tcp")
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{
		"db":    l4svc([]int{busy}, nil, db.instance("m1")),
		"cache": l4svc([]int{pcache}, nil, cache.instance("m1")),
	}))
	if c := dialPort(t, pcache); c.greeting != "cache-1" {
		t.Fatalf("cache port reached %q", c.greeting)
	}
	want := fmt.Sprintf("tcp/%d", busy)
	storetest.Eventually(t, wait, "the observation to report the busy port", func() bool {
		es := f.observation().L4Errors
		return len(es) == 1 && es[0].Port == want && es[0].Service == "db" && strings.Contains(es[0].Error, "address already in use")
	})
	_, body := f.adminGet("/edgeplane/projection")
	var st GatewayStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.L4Errors) != 1 || st.L4Ports[fmt.Sprintf("tcp/%d", pcache)] != "shop/cache" {
		t.Errorf("/edgeplane/projection: ports %v, errors %v", st.L4Ports, st.L4Errors)
	}
	held.Close()
	if c := dialPort(t, busy); c.greeting != "db-1" {
		t.Fatalf("freed port reached %q", c.greeting)
	}
	storetest.Eventually(t, wait, "the observation to report no port error", func() bool {
		return len(f.observation().L4Errors) == 0
	})
}

// An instance on a machine judged down gets no new connection while its
// service has another; a failed dial goes to the next candidate.
func TestL4DownMachineAndDeadInstance(t *testing.T) {
	f := newL4Fixture(t)
	a, b := newEchoServer(t, "db-a", "127.0.0.1"), newEchoServer(t, "db-b", "127.0.0.2")
	port := freePort(t, "tcp")
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": l4svc([]int{port}, nil, a.instance("m1"), b.instance("m2"))}))
	seen := map[string]int{}
	for i := 0; i < 10; i++ {
		c := dialPort(t, port)
		seen[c.greeting]++
		c.Close()
	}
	if seen["db-a"] == 0 || seen["db-b"] == 0 {
		t.Fatalf("both instances should take connections: %v", seen)
	}
	f.setDown("m1")
	storetest.Eventually(t, wait, "the gateway to judge m1 down", func() bool {
		_, down := f.proj().View().Down("m1")
		return down
	})
	for i := 0; i < 10; i++ {
		if c := dialPort(t, port); c.greeting != "db-b" {
			t.Fatalf("connection %d went to %q on a machine judged down", i, c.greeting)
		}
	}
	f.setDown()

	// A dead instance: every connection still reaches the live one, the
	// failed dials counted.
	dead := freePort(t, "tcp")
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": l4svc([]int{port}, nil,
		storetest.Instance{ID: "db-dead", Machine: "m1", Address: "127.0.0.1", Port: dead}, b.instance("m2"))}))
	for i := 0; i < 10; i++ {
		if c := dialPort(t, port); c.greeting != "db-b" {
			t.Fatalf("connection %d reached %q", i, c.greeting)
		}
	}
	if l4 := current.Load().shared.traffic.of(mustService(t, f, "shop", "db")).l4.snapshot(); l4 == nil || l4.ConnectErrors == 0 || l4.Refused != 0 {
		t.Errorf("db's counters after dials to a dead instance: %+v", l4)
	}
}

// A split service sends exactly its weight of connections to the new
// side.
func TestL4CanarySplitByConnection(t *testing.T) {
	f := newL4Fixture(t)
	port := freePort(t, "tcp")
	olds := []*echoServer{newEchoServer(t, "old-1", "127.0.0.1"), newEchoServer(t, "old-2", "127.0.0.1")}
	fresh := newEchoServer(t, "new-1", "127.0.0.1")
	f.load()
	ev := store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "shop", Service: "db", DeployID: "d2", Revision: 2,
		Layer4: store.Layer4{TCP: []store.L4Port{{Port: port}}}, Split: &store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 20},
		At: time.Now().UTC()}
	for i, e := range olds {
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: e.name, Machine: "m1", Slot: i, Revision: 1, Address: e.host, Port: e.port})
	}
	ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: fresh.name, Machine: "m1", Slot: 0, Revision: 2, Address: fresh.host, Port: fresh.port})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := storetest.AdmitMachine(ctx, f.nats.Store, "m1", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{ev})
	if err != nil {
		t.Fatal(err)
	}
	f.waitSeq(seq)
	dialPort(t, port).Close() // the port is open
	seen := map[string]int{}
	for i := 0; i < 100; i++ {
		c, err := tryPort(port)
		if err != nil {
			t.Fatal(err)
		}
		seen[c.greeting]++
		c.Close()
	}
	// 101 connections in all; the counter sends 20 of every 100 new.
	if n := seen["new-1"]; n < 19 || n > 21 {
		t.Errorf("new side took %d of 100 connections, want 20 (%v)", n, seen)
	}
	if seen["old-1"] == 0 || seen["old-2"] == 0 {
		t.Errorf("the old side's instances should share its connections: %v", seen)
	}
}

// layer4_bind must be an IP address.
func TestL4BindMustBeAnIP(t *testing.T) {
	f := newFixture(t)
	f.app = map[string]any{"layer4_bind": "gateway.local"}
	err := caddy.Load(f.config(), true)
	if err == nil {
		_ = caddy.Stop()
		t.Fatal("a config with layer4_bind gateway.local loaded")
	}
	if !strings.Contains(err.Error(), `layer4_bind "gateway.local" is not an IP address`) {
		t.Errorf("error = %v", err)
	}
}

// disable_layer4 keeps the ports closed; a reload without it opens them,
// and one with it again closes them.
func TestL4DisableFollowsTheConfig(t *testing.T) {
	f := newL4Fixture(t)
	db := newEchoServer(t, "db-1", "127.0.0.1")
	port := freePort(t, "tcp")
	f.app["disable_layer4"] = true
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": l4svc([]int{port}, nil, db.instance("m1"))}))
	time.Sleep(3 * l4Tick)
	if c, err := tryPort(port); err == nil {
		c.Close()
		t.Fatal("a port opened with disable_layer4")
	}
	delete(f.app, "disable_layer4")
	f.load()
	if c := dialPort(t, port); c.greeting != "db-1" {
		t.Fatalf("reached %q", c.greeting)
	}
	f.app["disable_layer4"] = true
	f.load()
	storetest.Eventually(t, wait, "the port to close", func() bool {
		c, err := tryPort(port)
		if c != nil {
			c.Close()
		}
		return err != nil
	})
}

// Stopping the gateway ends its layer-4 connections with it.
func TestL4StopEndsConnections(t *testing.T) {
	f := newL4Fixture(t)
	db := newEchoServer(t, "db-1", "127.0.0.1")
	port := freePort(t, "tcp")
	f.load()
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": l4svc([]int{port}, nil, db.instance("m1"))}))
	c := dialPort(t, port)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	if _, err := c.r.ReadString('\n'); err == nil {
		t.Fatal("a connection read data after the gateway stopped")
	}
	if _, err := tryPort(port); err == nil {
		t.Fatal("the port accepts after the gateway stopped")
	}
}

// A port the gateway's own HTTP server listens on is reported and never
// opened: the HTTP server keeps it.
func TestL4OwnHTTPPortIsRefused(t *testing.T) {
	f := newL4Fixture(t)
	db, web := newEchoServer(t, "db-1", "127.0.0.1"), newBackend(t, "web-1")
	_, p, _ := net.SplitHostPort(f.gateway)
	own, _ := strconv.Atoi(p)
	f.load()
	db1 := l4svc([]int{own}, nil, db.instance("m1"))
	f.waitSeq(f.deploy("shop", map[string]storetest.Service{"db": db1, "web": svc([]string{"shop.test"}, nil, web)}))
	storetest.Eventually(t, wait, "the observation to report the gateway's own port", func() bool {
		es := f.observation().L4Errors
		return len(es) == 1 && es[0].Port == fmt.Sprintf("tcp/%d", own) && strings.Contains(es[0].Error, "own HTTP server")
	})
	for i := 0; i < 5; i++ {
		if r := f.mustGet("shop.test", "/"); r.backend != "web-1" {
			t.Fatalf("HTTP on the gateway's port: %d from %q", r.status, r.backend)
		}
	}
}
