package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// needTools skips when a tool the test drives is missing (CI installs them:
// scripts/test-deps.sh).
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, b := range tools {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s (scripts/test-deps.sh installs it): %v", b, err)
		}
	}
}

// behindNAT puts a new host namespace on a LAN behind box i of tp, which
// becomes its router: it masquerades the LAN onto the shared segment with
// a fresh random port for every flow (--random-fully: endpoint-dependent
// mapping, what CGNAT and many shop routers do). With forward, the router
// also forwards UDP 51820 on its WAN address to the host. It returns the
// host's namespace.
func behindNAT(t *testing.T, tp *topo, i int, forward bool) string {
	t.Helper()
	router := tp.boxes[i]
	host := router + "h"
	sh(t, "ip", "netns", "add", host)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", host).Run() })
	a, b := router[2:]+"la", router[2:]+"lb"
	sh(t, "ip", "link", "add", a, "netns", router, "type", "veth", "peer", "name", b, "netns", host)
	lan := fmt.Sprintf("192.168.%d", 10+i)
	for _, args := range [][]string{
		{"-n", router, "addr", "add", lan + ".1/24", "dev", a},
		{"-n", router, "link", "set", a, "up"},
		{"-n", host, "link", "set", "lo", "up"},
		{"-n", host, "link", "set", b, "name", "eth0"},
		{"-n", host, "addr", "add", lan + ".2/24", "dev", "eth0"},
		{"-n", host, "link", "set", "eth0", "up"},
		{"-n", host, "route", "add", "default", "via", lan + ".1"},
	} {
		sh(t, append([]string{"ip"}, args...)...)
	}
	in := func(args ...string) { sh(t, append([]string{"ip", "netns", "exec", router}, args...)...) }
	in("sysctl", "-qw", "net.ipv4.ip_forward=1")
	in("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE", "--random-fully")
	if forward {
		in("iptables", "-t", "nat", "-A", "PREROUTING", "-i", "eth0", "-p", "udp", "--dport", "51820",
			"-j", "DNAT", "--to-destination", lan+".2:51820")
	}
	return host
}

// udpBetween adds (-I) or deletes (-D) rules on both routers that drop
// UDP between their WAN addresses: a firewall between the two sites.
func udpBetween(t *testing.T, tp *topo, op string) {
	t.Helper()
	for i, router := range tp.boxes[:2] {
		other := tp.addrs[1-i]
		for _, dir := range []string{"-s", "-d"} {
			sh(t, "ip", "netns", "exec", router, "iptables", op, "FORWARD", "-p", "udp", dir, other, "-j", "DROP")
		}
	}
}

// peerPath is how b's device reaches machine now ("" if not at all).
func (b *box) peerPath(t *testing.T, machine string) string {
	for _, p := range b.status(t).Peers {
		if p.Machine == machine && p.Key == "" {
			return p.Path
		}
	}
	return ""
}

// TestRelayFallbackBehindNATs: two boxes, each behind its own NAT that
// maps every flow to a new port, with UDP between the two sites dropped.
// They cannot reach each other directly, so they connect through the
// relay the control box runs (ping and HTTP over the mesh), and status
// says relayed. Lifting the block lets boxa's probe reach boxb's port
// forward: the tunnel moves to the direct path within the probe interval.
func TestRelayFallbackBehindNATs(t *testing.T) {
	needRoot(t)
	needTools(t, "iptables", "sysctl")
	dir := t.TempDir()
	tp := newTopo(t, 2)
	c := startControl(t, tp, dir, "--relay-port", "3480")
	nsA := behindNAT(t, tp, 0, false)
	nsB := behindNAT(t, tp, 1, true)
	udpBetween(t, tp, "-I")

	a := joinNS(t, c, dir, nsA, "boxa")
	b := joinNS(t, c, dir, nsB, "boxb", "--advertise", tp.addrs[1]+":51820")
	const probe = "1s"
	for _, x := range []*box{a, b} {
		x.start(t, "--relay-after", "3s", "--probe-interval", probe)
	}
	storetest.Eventually(t, 10*time.Second, "both boxes hold a relayed address", func() bool {
		return a.status(t).Relay.Address != "" && b.status(t).Relay.Address != ""
	})
	if s := a.status(t); s.NAT.Type != node.NATEndpointDependent {
		t.Fatalf("boxa's NAT classified %q, want %s (the test NAT must map every flow anew)", s.NAT.Type, node.NATEndpointDependent)
	}
	waitPing(t, a.ns, b.meshIP, "boxa -> boxb through the relay")
	waitPing(t, b.ns, a.meshIP, "boxb -> boxa through the relay")
	for _, x := range []struct {
		from  *box
		other string
	}{{a, "boxb"}, {b, "boxa"}} {
		if p := x.from.peerPath(t, x.other); p != node.PathRelayed {
			t.Fatalf("%s reaches %s %q, want %s", x.from.machine, x.other, p, node.PathRelayed)
		}
	}
	self, _ := os.Executable()
	start(t, filepath.Join(dir, "http.log"), nil, []string{"MESHD_TEST_HTTP_SERVE=" + b.meshIP + ":8080"},
		"ip", "netns", "exec", b.ns, self)
	storetest.Eventually(t, 10*time.Second, "HTTP boxa -> boxb through the relay", func() bool {
		cmd := exec.Command("ip", "netns", "exec", a.ns, self)
		cmd.Env = append(os.Environ(), "MESHD_TEST_HTTP_GET=http://"+b.meshIP+":8080/")
		out, err := cmd.Output()
		return err == nil && strings.Contains(string(out), "hello over the mesh")
	})

	// The firewall goes: boxa's next probe reaches boxb's port forward.
	udpBetween(t, tp, "-D")
	lifted := time.Now()
	storetest.Eventually(t, 10*time.Second, "both ends back on the direct path", func() bool {
		return a.peerPath(t, "boxb") == node.PathDirect && b.peerPath(t, "boxa") == node.PathDirect
	})
	t.Logf("direct again %s after the block was lifted (probe interval %s)", time.Since(lifted).Round(time.Millisecond), probe)
	// It stays there past the relay-after bound: the session carried on
	// over the new path without a fresh handshake, which is no reason to
	// go back to the relay.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if a.peerPath(t, "boxb") != node.PathDirect || b.peerPath(t, "boxa") != node.PathDirect {
			t.Fatal("the tunnel left the direct path again")
		}
		waitPing(t, a.ns, b.meshIP, "boxa -> boxb directly")
	}
	for _, p := range a.status(t).Peers {
		if p.Machine == "boxb" && !strings.HasPrefix(p.Endpoint, tp.addrs[1]+":") {
			t.Fatalf("boxa reaches boxb at %s, want boxb's port forward on %s", p.Endpoint, tp.addrs[1])
		}
	}
	waitPing(t, b.ns, a.meshIP, "boxb -> boxa directly")
}

// TestRotationUnderIperf: box1 rotates its key while iperf3 pushes TCP from
// box1 to box2 over the mesh. The connection survives (iperf3 exits 0 and
// no second carries nothing), box2 ends up with box1's new key only, and
// box1's old key is gone from box2 after the overlap.
func TestRotationUnderIperf(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3")
	dir := t.TempDir()
	tp := newTopo(t, 2)
	c := startControl(t, tp, dir)
	var boxes []*box
	for i := range 2 {
		b := joinBox(t, tp, c, dir, i)
		b.start(t, "--key-overlap", "6s")
		boxes = append(boxes, b)
	}
	b1, b2 := boxes[0], boxes[1]
	waitPing(t, b1.ns, b2.meshIP, "box1 -> box2")
	oldKey := b1.status(t).PublicKey

	start(t, filepath.Join(dir, "iperf3-server.log"), nil, nil, "ip", "netns", "exec", b2.ns, "iperf3", "-s", "-1", "-B", b2.meshIP)
	storetest.Eventually(t, 10*time.Second, "iperf3 server on box2", func() bool {
		return exec.Command("ip", "netns", "exec", b2.ns, "sh", "-c", "ss -ltn | grep -q ':5201'").Run() == nil
	})
	const seconds = 12
	client := exec.Command("ip", "netns", "exec", b1.ns, "iperf3", "-c", b2.meshIP, "-t", fmt.Sprint(seconds), "-J")
	var out strings.Builder
	client.Stdout = &out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- client.Wait() }()
	t.Cleanup(func() {
		if client.ProcessState == nil {
			_ = client.Process.Kill()
			<-done
		}
	})
	// A few seconds in, the operator rotates box1's key.
	storetest.Eventually(t, 10*time.Second, "iperf3 under way", func() bool {
		for _, p := range b2.status(t).Peers {
			if p.Machine == "box1" && p.RxBytes > 50<<20 {
				return true
			}
		}
		return false
	})
	c.ask(t, "rotate box1", "ROTATE")
	storetest.Eventually(t, 10*time.Second, "box1 on a new key", func() bool { return b1.status(t).PublicKey != oldKey })
	newKey := b1.status(t).PublicKey

	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("iperf3 failed across the rotation: %v\n%s", err, out.String())
		}
	case <-time.After((seconds + 20) * time.Second):
		t.Fatal("iperf3 did not finish")
	}
	var res struct {
		Intervals []struct {
			Sum struct {
				Bytes  int64   `json:"bytes"`
				Start  float64 `json:"start"`
				BitsPS float64 `json:"bits_per_second"`
			} `json:"sum"`
		} `json:"intervals"`
		End struct {
			SumReceived struct {
				Bytes int64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil || res.Error != "" {
		t.Fatalf("iperf3 output: %v %s\n%s", err, res.Error, out.String())
	}
	if len(res.Intervals) < seconds-1 {
		t.Fatalf("iperf3 reported %d intervals, want %d", len(res.Intervals), seconds)
	}
	var slowest float64 = -1
	for _, iv := range res.Intervals {
		if iv.Sum.Bytes == 0 {
			t.Fatalf("iperf3 moved nothing in the second from %.0fs: the tunnel dropped", iv.Sum.Start)
		}
		if slowest < 0 || iv.Sum.BitsPS < slowest {
			slowest = iv.Sum.BitsPS
		}
	}
	t.Logf("iperf3 across the rotation: %d MB received, slowest second %.0f Mbit/s", res.End.SumReceived.Bytes>>20, slowest/1e6)

	storetest.Eventually(t, 15*time.Second, "box2 holds only box1's new key", func() bool {
		var keys []string
		for _, p := range b2.status(t).Peers {
			if p.Machine == "box1" {
				keys = append(keys, p.PublicKey)
			}
		}
		return len(keys) == 1 && keys[0] == newKey
	})
	waitPing(t, b1.ns, b2.meshIP, "box1 -> box2 on the new key")
}
