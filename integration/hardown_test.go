package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

const fourReplicas = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 4
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`

// outcome is one request of a timed load: when it started, whether it
// succeeded, and which instance (or release version) answered.
type outcome struct {
	start    time.Time
	ok       bool
	instance string
	version  string
	code     int
	err      string
}

// timedLoad sends requests from workers until stop closes and keeps every
// outcome.
func (g *gateway) timedLoad(host string, workers int, stop <-chan struct{}) func() []outcome {
	return timedRequests(workers, stop, func() outcome {
		o := outcome{start: time.Now()}
		code, inst, err := g.request(host, "/")
		o.ok, o.instance, o.code = err == nil && code == 200, inst, code
		if !o.ok {
			o.err = fmt.Sprintf("%d %s %v", code, inst, err)
		}
		return o
	})
}

// timedRequests runs do from workers until stop closes; the returned
// func waits for them and gives every outcome, in start order.
func timedRequests(workers int, stop <-chan struct{}, do func() outcome) func() []outcome {
	var mu sync.Mutex
	var all []outcome
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := do()
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
			}
		}()
	}
	return func() []outcome {
		wg.Wait()
		sort.Slice(all, func(i, j int) bool { return all[i].start.Before(all[j].start) })
		return all
	}
}

// TestFrozenMachineCostsNoRequests is a box that stops answering without
// warning: two machines run hello's four replicas, two each; steady
// traffic goes through a gateway configured as the shipped caddy.json is;
// machine m2's agent and instances are frozen (SIGSTOP), then thawed. From
// 3 s after the freeze no request fails (the gateway's health checks set
// m2's endpoints aside), and once thawed m2's instances serve again with no
// deploy.
func TestFrozenMachineCostsNoRequests(t *testing.T) {
	c := newCluster(t)
	// Beats every second: m2 is judged stale 3 s into its freeze.
	c.agentArgs = []string{"--heartbeat", "1s"}
	c.join("m1")
	c.join("m2")
	all, onM2 := deployTwoEach(t, c)
	gw := c.startGatewayWith("gw", shippedHandler(t))
	eventually(t, 10*time.Second, "the gateway to serve all four", func() bool {
		return servesOnly(gw, "shop.example.com", all, 4)
	})

	pids := recordedPIDs(filepath.Join(c.agentDir("m2"), "instances", "*.json"))
	if len(pids) != 2 {
		t.Fatalf("m2 runs instances %v", pids)
	}
	signalM2 := func(sig syscall.Signal) {
		c.agents["m2"].signal(sig)
		for _, pid := range pids {
			_ = syscall.Kill(-pid, sig)
		}
	}
	t.Cleanup(func() { signalM2(syscall.SIGCONT) })

	// Frozen, m2 stops beating: the gateway's projection says so, and its
	// routes name why m2's instances are set aside.
	judged := func() {
		eventually(t, 5*time.Second, "the gateway to judge m2 down", func() bool {
			st, err := gw.projectionFull()
			return err == nil && st.MachinesDown["m2"].Liveness == store.MachineStale
		})
		routes := routesOf(t, gw)
		if n := strings.Count(routes, `machine m2 is stale: no heartbeat since `); n != 2 {
			t.Errorf("routes give m2's liveness as the reason %d times, want 2: %s", n, routes)
		}
	}
	ws := ridesOut(t, gw, onM2, "frozen", func() { signalM2(syscall.SIGSTOP) }, func() { signalM2(syscall.SIGCONT) }, judged)
	eventually(t, 10*time.Second, "the gateway to judge m2 live again", func() bool {
		st, err := gw.projectionFull()
		return err == nil && len(st.MachinesDown) == 0
	})

	// A deploy of the websocket's service that starts two more replicas
	// and then stops them again leaves its instance, and it, alone.
	six := strings.Replace(fourReplicas, "replicas: 4", "replicas: 6", 1)
	c.mustControl("deploy", "apply", "-f", c.manifest("six.yaml", six), "--gateway-wait", "10s")
	c.mustControl("deploy", "apply", "-f", c.manifest("four.yaml", fourReplicas), "--gateway-wait", "10s")
	checkWebsocket(t, ws(), 100)
}

// deployTwoEach deploys hello's four replicas on machines m1 and m2, two
// each, and returns their IDs and those on m2.
func deployTwoEach(t *testing.T, c *cluster) ([]string, map[string]bool) {
	t.Helper()
	c.mustControl("deploy", "apply", "-f", c.manifest("four.yaml", fourReplicas), "--gateway-wait", "10s")
	byMachine := map[string][]string{}
	var all []string
	for _, in := range c.instances("shop") {
		byMachine[in.Machine] = append(byMachine[in.Machine], in.ID)
		all = append(all, in.ID)
	}
	if len(byMachine["m1"]) != 2 || len(byMachine["m2"]) != 2 {
		t.Fatalf("placement: %v, want two instances on each machine", byMachine)
	}
	return all, map[string]bool{byMachine["m2"][0]: true, byMachine["m2"][1]: true}
}

// TestCutMachineCostsNoRequests is the same with machine m2 in a network
// namespace of its own whose link goes down (a box that loses its network
// or its power: packets to it vanish), then up again. The storage node
// listens beyond loopback, so everything runs with credentials and TLS.
func TestCutMachineCostsNoRequests(t *testing.T) {
	buildExtra(t)
	lab := newNetLab(t, 1)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}}
	c.startServer(lab.subnet + ".254:0")
	t.Cleanup(c.killInstances)
	c.join("m1", "--address", "127.0.0.1") // on a store other boxes reach, the operator pins loopback
	c.joinIn("m2", lab.ns[0], lab.addr(1))
	all, onM2 := deployTwoEach(t, c)
	gw := startEdgeGatewayWith(t, c, "gw", c.url, c.issueCreds(storagenode.RoleGateway, "gw"), shippedHandler(t))
	eventually(t, 10*time.Second, "the gateway to serve all four", func() bool {
		return servesOnly(gw, "shop.example.com", all, 4)
	})
	link := func(state string) func() {
		return func() { run(t, "ip", "-n", lab.ns[0], "link", "set", "eth0", state) }
	}
	ws := ridesOut(t, gw, onM2, "cut off", link("down"), link("up"), nil)
	checkWebsocket(t, ws(), 80)
}

// ridesOut runs steady traffic, a long-lived response and a websocket
// (both on an instance not in lost) through gw while the machine of the
// instances in lost is lost (down) for 15 s and comes back (up), and
// checks what the clients saw: no request sent from 3 s after the loss on
// fails, the response runs on, and the machine's instances serve again
// with no deploy. whileDown, when set, runs 5 s into the loss. It returns
// the websocket, still open.
func ridesOut(t *testing.T, gw *gateway, lost map[string]bool, how string, down, up, whileDown func()) func() wsResult {
	t.Helper()
	onM2 := lost
	// A long-lived response and a websocket on m1's instances stay open
	// through the freeze and the thaw.
	notLost := func(inst string) bool { return !onM2[inst] }
	stream := gw.openStream(t, "shop.example.com", 120, notLost)
	ws := gw.openWebsocket(t, "shop.example.com", notLost)
	stop := make(chan struct{})
	collect := gw.timedLoad("shop.example.com", 4, stop)
	time.Sleep(2 * time.Second) // steady traffic before the freeze
	freeze := time.Now()
	down()
	setAside := gw.watchSetAside(lost)
	time.Sleep(5 * time.Second) // the machine stays frozen
	if whileDown != nil {
		whileDown()
	}
	time.Sleep(time.Until(freeze.Add(15 * time.Second)))
	thaw := time.Now()
	up()
	deadline := time.Now().Add(15 * time.Second)
	for {
		served := false
		code, inst, err := gw.request("shop.example.com", "/")
		served = err == nil && code == 200 && onM2[inst]
		if served {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			collect()
			t.Fatalf("m2's instances serve no request 15 s after it came back")
		}
	}
	back := time.Since(thaw)
	close(stop)
	all := collect()

	// Requests in flight at the freeze fail with those sent in its first
	// 3 s, while the health checks have not yet set m2 aside.
	var first, rest, firstN, restN int
	var lastToM2 time.Time
	var errs []string
	for _, o := range all {
		switch {
		case o.start.Before(freeze.Add(3 * time.Second)):
			if !o.start.Before(freeze) {
				firstN++
			}
			if !o.ok {
				first++
				lastToM2 = o.start
			}
		case o.start.Before(thaw):
			restN++
			if !o.ok {
				rest++
				errs = append(errs, o.err)
				lastToM2 = o.start
			}
		}
	}
	last := "none after the loss"
	if lastToM2.After(freeze) {
		last = fmt.Sprintf("%.1fs after the loss", lastToM2.Sub(freeze).Seconds())
	}
	aside := "never"
	if at := setAside(); !at.IsZero() {
		aside = fmt.Sprintf("%s after the loss", at.Sub(freeze).Round(10*time.Millisecond))
	}
	t.Logf(how+": in flight at the loss or sent in its first 3 s: %d failed (%d sent in those 3 s, %.2f%%); from 3 s to its return: %d of %d failed; "+
		"the last failed request: %s; m2's instances set aside (no new request): %s; m2 served again %s after it came back",
		first, firstN, 100*float64(first)/float64(max(firstN, 1)), rest, restN, last, aside, back.Round(time.Millisecond))
	if rest > 0 {
		t.Errorf("%d requests failed from 3 s after the loss to its return: %v", rest, errs)
	}
	res := stream()
	t.Logf("stream from %s: %d lines, longest gap %s, %v", res.instance, res.lines, res.maxGap.Round(time.Millisecond), res.err)
	if res.err != nil || res.lines != 120 || res.maxGap > 2*time.Second {
		t.Errorf("the long-lived response was cut or stalled: %+v", res)
	}
	return ws
}

// streamResult is how a long-lived response went.
type streamResult struct {
	instance string
	lines    int
	maxGap   time.Duration
	err      error
}

// openStream opens hello's /stream?lines=n through the gateway, retrying
// until an instance accepted by want answers, and reads it in the
// background; the returned func waits for its end.
func (g *gateway) openStream(t *testing.T, host string, n int, want func(instance string) bool) func() streamResult {
	t.Helper()
	client := &http.Client{} // no timeout: the response is meant to last
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/stream?lines=%d", g.http, n), nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("opening a stream: %v", err)
		}
		r := bufio.NewReader(resp.Body)
		line, err := r.ReadString('\n')
		inst, _, _ := strings.Cut(line, " ")
		if err != nil || resp.StatusCode != 200 || !want(inst) {
			resp.Body.Close()
			if time.Now().After(deadline) {
				t.Fatalf("no stream from a wanted instance: %d %q %v", resp.StatusCode, line, err)
			}
			continue
		}
		done := make(chan streamResult, 1)
		go func() {
			defer resp.Body.Close()
			res := streamResult{instance: inst, lines: 1}
			last := time.Now()
			for {
				_, err := r.ReadString('\n')
				if err == io.EOF {
					break
				}
				if err != nil {
					res.err = err
					break
				}
				res.lines++
				res.maxGap = max(res.maxGap, time.Since(last))
				last = time.Now()
			}
			done <- res
		}()
		return func() streamResult { return <-done }
	}
}

// wsResult is how a websocket held open through the gateway went.
type wsResult struct {
	instance  string
	exchanges int
	maxGap    time.Duration
	err       error
}

// openWebsocket opens hello's /ws through the gateway, retrying until an
// instance accepted by want answers, and exchanges a message on it every
// 200 ms in the background; the returned func closes it and says how it
// went.
func (g *gateway) openWebsocket(t *testing.T, host string, want func(instance string) bool) func() wsResult {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+host+"/ws", "http://"+host+"/")
	if err != nil {
		t.Fatal(err)
	}
	exchange := func(ws *websocket.Conn, n int) (string, error) {
		_ = ws.SetDeadline(time.Now().Add(5 * time.Second))
		msg := strconv.Itoa(n)
		if err := websocket.Message.Send(ws, msg); err != nil {
			return "", err
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			return "", err
		}
		inst, echo, _ := strings.Cut(got, " ")
		if echo != msg {
			return "", fmt.Errorf("sent %q, the echo was %q", msg, got)
		}
		return inst, nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("tcp", g.http)
		if err != nil {
			t.Fatalf("dialling the gateway: %v", err)
		}
		ws, err := websocket.NewClient(cfg, conn)
		var inst string
		if err == nil {
			inst, err = exchange(ws, 0)
		}
		if err != nil || !want(inst) {
			conn.Close()
			if time.Now().After(deadline) {
				t.Fatalf("no websocket to a wanted instance: %q %v", inst, err)
			}
			continue
		}
		stop, done := make(chan struct{}), make(chan wsResult, 1)
		go func() {
			defer ws.Close()
			res := wsResult{instance: inst, exchanges: 1}
			last := time.Now()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					done <- res
					return
				case <-tick.C:
				}
				got, err := exchange(ws, res.exchanges)
				if err == nil && got != inst {
					err = fmt.Errorf("answered by %s, opened on %s", got, inst)
				}
				if err != nil {
					res.err = err
					done <- res
					return
				}
				res.exchanges++
				res.maxGap = max(res.maxGap, time.Since(last))
				last = time.Now()
			}
		}()
		var once sync.Once
		var res wsResult
		return func() wsResult {
			once.Do(func() { close(stop); res = <-done })
			return res
		}
	}
}

// checkWebsocket fails t unless the websocket ran through without a cut
// or a stall, for at least min exchanges.
func checkWebsocket(t *testing.T, res wsResult, min int) {
	t.Helper()
	t.Logf("websocket on %s: %d exchanges, longest gap %s, %v", res.instance, res.exchanges, res.maxGap.Round(time.Millisecond), res.err)
	if res.err != nil || res.exchanges < min || res.maxGap > 2*time.Second {
		t.Errorf("the websocket was cut or stalled: %+v", res)
	}
}

// watchSetAside polls the gateway's routes from now until every instance
// in lost is set aside (no new request goes to it), for up to 10 s; the
// returned func says when that was (zero: not within 10 s).
func (g *gateway) watchSetAside(lost map[string]bool) func() time.Time {
	done := make(chan time.Time, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var routes []struct {
				SetAside []struct {
					InstanceID string `json:"instance_id"`
				} `json:"set_aside"`
			}
			resp, err := http.Get("http://" + g.admin + "/edgeplane/routes")
			if err == nil {
				err = json.NewDecoder(resp.Body).Decode(&routes)
				resp.Body.Close()
			}
			n := 0
			for _, r := range routes {
				for _, sa := range r.SetAside {
					if lost[sa.InstanceID] {
						n++
					}
				}
			}
			if err == nil && n == len(lost) {
				done <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond) // the polling period
		}
		done <- time.Time{}
	}()
	return func() time.Time { return <-done }
}
