package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// redisLoad opens a new connection through the gateway for every command
// from workers until stop closes: each outcome's instance is the port of
// the Redis instance that answered.
func redisLoad(addr string, workers int, stop <-chan struct{}) func() []outcome {
	return timedRequests(workers, stop, func() outcome {
		o := outcome{start: time.Now()}
		port, err := redisOnce(addr, time.Second)
		o.ok, o.instance = err == nil, strconv.Itoa(port)
		if err != nil {
			o.err = err.Error()
		}
		return o
	})
}

// heldConn is a connection kept open across a routing change, PINGed
// every 100 ms until it fails: when it last answered and when it ended.
type heldConn struct {
	port int
	mu   sync.Mutex
	ok   []time.Time
	end  time.Time
	err  error
	done chan struct{}
}

func holdRedis(t *testing.T, addr string) *heldConn {
	t.Helper()
	conn, err := dialRedis(addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldConn{done: make(chan struct{})}
	if h.port, err = conn.redisPort(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.done)
		defer conn.Close()
		for {
			// Longer than the drain timeout: the connection ends because
			// the gateway closes it, not because a reply is late.
			r, err := conn.do("PING", 10*time.Second)
			h.mu.Lock()
			if err != nil || r != "PONG" {
				h.end, h.err = time.Now(), fmt.Errorf("reply %q: %v", r, err)
				h.mu.Unlock()
				return
			}
			h.ok = append(h.ok, time.Now())
			h.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return h
}

// benchResultRe is one test's result in redis-benchmark -q's output (after
// a carriage return: its progress lines are overwritten, not ended).
var benchResultRe = regexp.MustCompile(`([A-Z_]+): ([\d.]+) requests per second`)

// testRedisRedeploy redeploys Redis's two replicas (a changed env var)
// under load through the gateway's TCP port: redis-benchmark with a new
// connection per command (-k 0) and a Go client doing the same fail no
// command, new connections reach the new instances at once, and a
// connection held on an old instance keeps answering until the gateway
// closes it at the service's drain timeout (4 s), which the deploy waits
// for before stopping the old instances.
func testRedisRedeploy(t *testing.T, c *cluster, gw *l4gateway) {
	addr := gw.at(6379)
	eventually(t, 10*time.Second, "redis to answer through the gateway", func() bool {
		_, err := redisOnce(addr, time.Second)
		return err == nil
	})
	old := c.instancesByPort("kv")
	if len(old) != 2 {
		t.Fatalf("kv runs %d instances, want 2", len(old))
	}
	held := holdRedis(t, addr)
	if _, ok := old[held.port]; !ok {
		t.Fatalf("held connection reached port %d, not an instance of kv (%v)", held.port, old)
	}

	stop := make(chan struct{})
	outcomes := redisLoad(addr, 4, stop)
	bench := start(t, "redis-benchmark", nil, "redis-benchmark", "-h", gw.bind, "-p", "6379",
		"-k", "0", "-c", "4", "-n", "500", "-t", "ping,set,get", "-q", "-l")
	time.Sleep(time.Second) // load before the switch

	// The gateway's observation lists the held connection's instance as
	// draining while the deploy waits for it.
	sawDrain := make(chan string, 1)
	watchStop := make(chan struct{})
	go func() {
		for {
			select {
			case <-watchStop:
				close(sawDrain)
				return
			case <-time.After(100 * time.Millisecond):
			}
			_ = c.store.ListGatewayObservations(context.Background(), func(o *store.GatewayObservation) error {
				for _, d := range o.L4Draining {
					if d.Namespace == "kv" && d.Instance == old[held.port].ID && len(sawDrain) == 0 {
						sawDrain <- fmt.Sprintf("%+v", d)
					}
				}
				return nil
			})
		}
	}()
	deployStart := time.Now()
	out := c.mustControl("deploy", "apply", "-f", c.l4manifest("kv2.yaml", redisManifest("2")),
		"--drain-grace", "100ms", "--gateway-wait", "10s")
	deployEnd := time.Now()
	close(watchStop)
	time.Sleep(500 * time.Millisecond) // load past the old instances' stop
	close(stop)
	all := outcomes()
	select {
	case <-bench.done:
		t.Fatalf("redis-benchmark ended on its own during the redeploy (%v):\n%s", bench.err, bench.output())
	default:
	}
	bench.stop(syscall.SIGINT)
	t.Logf("deploy took %s:\n%s", deployEnd.Sub(deployStart).Round(time.Millisecond), out)
	if drain, ok := <-sawDrain; !ok {
		t.Errorf("the gateway's observation never listed %s draining", old[held.port].ID)
	} else {
		t.Logf("the gateway's observation during the deploy: %s", drain)
	}
	if !strings.Contains(out, "for gateways' layer-4 connections to") || !strings.Contains(out, "layer-4 connections drained after") {
		t.Errorf("the deploy did not say it waited for the layer-4 drain:\n%s", out)
	}

	// redis-benchmark stops at its first failed command: it ran all along.
	benchOut := bench.output()
	if strings.Contains(benchOut, "Error") || strings.Contains(benchOut, "error") {
		t.Errorf("redis-benchmark reported errors:\n%s", benchOut)
	}
	rounds := benchResultRe.FindAllStringSubmatch(benchOut, -1)
	if len(rounds) < 4 {
		t.Errorf("redis-benchmark finished %d tests (of 500 commands each) through the redeploy:\n%s", len(rounds), benchOut)
	}

	now := c.instancesByPort("kv")
	for p, in := range old {
		if n, ok := now[p]; ok && n.ID == in.ID {
			t.Errorf("old instance %s survived the redeploy", in.ID)
		}
	}
	var failed, toOld, toNew int
	var lastOld, firstNew time.Time
	for _, o := range all {
		port, _ := strconv.Atoi(o.instance)
		_, isOld := old[port]
		_, isNew := now[port]
		switch {
		case !o.ok:
			failed++
			t.Errorf("command at %s failed: %s", o.start.Sub(deployStart).Round(time.Millisecond), o.err)
		case isOld:
			toOld++
			lastOld = o.start
		case isNew:
			toNew++
			if firstNew.IsZero() {
				firstNew = o.start
			}
		default:
			t.Errorf("command reached port %d, no instance of kv's", port)
		}
	}
	t.Logf("redeploy under load: %d new connections (%d to old instances, %d to new), %d failed; redis-benchmark: %d tests of 500 commands",
		len(all), toOld, toNew, failed, len(rounds))
	if toOld == 0 || toNew == 0 {
		t.Fatalf("load reached %d old and %d new connections' instances", toOld, toNew)
	}
	if firstNew.Before(lastOld.Add(-time.Second)) {
		t.Errorf("new connections reached old and new instances side by side for %s", lastOld.Sub(firstNew))
	}

	// The held connection: answered after the switch, closed at the drain
	// timeout after it (4 s; the gateway's closer has some slack), before
	// the deploy went on to stop its instance.
	<-held.done
	held.mu.Lock()
	defer held.mu.Unlock()
	var after int
	for _, at := range held.ok {
		if at.After(lastOld.Add(200 * time.Millisecond)) {
			after++
		}
	}
	closedAfter := held.end.Sub(lastOld)
	t.Logf("held connection on %d: %d PINGs answered after the switch, closed %s after it (%v); the deploy ended %s after the close",
		held.port, after, closedAfter.Round(10*time.Millisecond), held.err, deployEnd.Sub(held.end).Round(10*time.Millisecond))
	if after < 10 {
		t.Errorf("the held connection answered %d PINGs after the switch", after)
	}
	if closedAfter < 3500*time.Millisecond || closedAfter > 7*time.Second {
		t.Errorf("the held connection ended %s after the switch, want the drain timeout (4s)", closedAfter)
	}
	if !deployEnd.After(held.end) {
		t.Errorf("the deploy ended at %s, before the held connection did (%s): it did not wait for the drain",
			deployEnd.Sub(deployStart), held.end.Sub(deployStart))
	}
}

// testRedisFrozenMachine freezes machine m2 (its agent and instances
// SIGSTOPped) under a load of new connections to Redis's replica on each
// machine: from 3 s after the freeze (the machine judged stale; asserted
// with margin) every new connection goes to m1's replica and answers.
func testRedisFrozenMachine(t *testing.T, c *cluster, gw *l4gateway) {
	addr := gw.at(6379)
	onM2 := map[string]bool{}
	byMachine := map[string]int{}
	for _, in := range c.instances("kv") {
		byMachine[in.Machine]++
		if in.Machine == "m2" {
			onM2[strconv.Itoa(in.Port)] = true
		}
	}
	if byMachine["m1"] != 1 || byMachine["m2"] != 1 {
		t.Fatalf("kv's placement %v, want one replica on each machine", byMachine)
	}
	pids := recordedPIDs(filepath.Join(c.agentDir("m2"), "instances", "*.json"))
	signalM2 := func(sig syscall.Signal) {
		c.agents["m2"].signal(sig)
		for _, pid := range pids {
			_ = syscall.Kill(-pid, sig)
		}
	}
	t.Cleanup(func() { signalM2(syscall.SIGCONT) })

	stop := make(chan struct{})
	outcomes := redisLoad(addr, 4, stop)
	time.Sleep(2 * time.Second)
	freeze := time.Now()
	signalM2(syscall.SIGSTOP)
	time.Sleep(10 * time.Second)
	signalM2(syscall.SIGCONT)
	thaw := time.Now()
	close(stop)
	all := outcomes()

	const bound = 5 * time.Second // the goal's 3 s, with margin for a loaded box
	var before, lost, late int
	var lastLost time.Time
	for _, o := range all {
		switch {
		case o.start.After(thaw):
		case o.start.Before(freeze):
			if o.ok && onM2[o.instance] {
				before++
			}
		case !o.ok || onM2[o.instance]:
			lost++
			lastLost = o.start
			if o.start.After(freeze.Add(bound)) {
				late++
				t.Errorf("connection at %s after the freeze: ok=%v instance %s %s",
					o.start.Sub(freeze).Round(time.Millisecond), o.ok, o.instance, o.err)
			}
		}
	}
	figure := "none"
	if !lastLost.IsZero() {
		figure = lastLost.Sub(freeze).Round(10*time.Millisecond).String() + " after the freeze"
	}
	t.Logf("frozen m2: %d connections in all, %d to m2 before the freeze, %d lost to it after (the last started %s), %d past %s",
		len(all), before, lost, figure, late, bound)
	if before == 0 {
		t.Fatal("no connection reached m2 before the freeze: the test proves nothing")
	}

	// Thawed, m2's replica takes new connections again, with no deploy.
	eventually(t, 15*time.Second, "new connections to reach m2 again", func() bool {
		for i := 0; i < 20; i++ {
			if p, err := redisOnce(addr, time.Second); err == nil && onM2[strconv.Itoa(p)] {
				return true
			}
		}
		return false
	})
}
