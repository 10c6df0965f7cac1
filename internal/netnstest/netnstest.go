// Package netnstest gives a test an address of this box that is not
// loopback: one end of a veth pair whose other end lives in a network
// namespace of its own, both removed when the test ends. It needs root
// (and iproute2's ip).
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Available says whether this process may make network namespaces.
func Available() bool {
	if os.Geteuid() != 0 {
		return false
	}
	_, err := exec.LookPath("ip")
	return err == nil
}

// NonLoopbackAddr returns 10.<subnet>.N.1, an address of this box on a veth
// pair whose peer (10.<subnet>.N.2) is in a namespace of its own; name (up
// to four letters) keeps its interfaces apart from other tests'. Without
// root or ip it skips the test, saying why.
func NonLoopbackAddr(t testing.TB, name string, subnet int) string {
	t.Helper()
	if !Available() {
		t.Skip("needs root and iproute2's ip: the test makes a network namespace and a veth pair for an address that is not loopback")
	}
	// Interface names must fit 15 bytes and not meet another test's.
	tag := fmt.Sprintf("%05d", os.Getpid()%100000)
	ns, host, peer := name+"n"+tag, name+"a"+tag, name+"b"+tag
	octet := os.Getpid()%200 + 20
	addr := fmt.Sprintf("10.%d.%d.1", subnet, octet)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	sh("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	sh("ip", "addr", "add", addr+"/30", "dev", host)
	sh("ip", "link", "set", host, "up")
	sh("ip", "netns", "exec", ns, "ip", "addr", "add", fmt.Sprintf("10.%d.%d.2/30", subnet, octet), "dev", peer)
	sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
	return addr
}
