package integration

import (
	"net"
	"testing"
	"time"
)

// The lab's wire: a TCP connect (one round trip) between regions takes
// labRTT, within a region well under a millisecond.
func TestRegionLabWire(t *testing.T) {
	lab := newRegionNet(t)
	// A listener at every region's second machine address, opened in its
	// namespace.
	for _, r := range lab.regions {
		var ln net.Listener
		if err := inNetns(r.ns, func() (err error) {
			ln, err = net.Listen("tcp", r.machineAddr(1)+":7000")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	for _, from := range lab.regions {
		for _, to := range lab.regions {
			got, err := lab.connectTime(from, to.machineAddr(1)+":7000", 7)
			if err != nil {
				t.Fatalf("connecting from %s to %s: %v", from.name, to.name, err)
			}
			want := rttBetween(from.name, to.name)
			t.Logf("connect %s -> %s: %s (round trip %s)", from.name, to.name, got.Round(10*time.Microsecond), want)
			switch {
			case want == 0 && got >= time.Millisecond:
				t.Errorf("connect within %s took %s, want < 1ms", from.name, got)
			case want > 0 && (got < want || got > want+10*time.Millisecond):
				t.Errorf("connect %s -> %s took %s, want %s (+10ms at most)", from.name, to.name, got, want)
			}
		}
	}
	// The root namespace (the control plane, the tests' clients) reaches
	// every region without delay.
	for _, r := range lab.regions {
		begin := time.Now()
		c, err := net.DialTimeout("tcp", r.machineAddr(1)+":7000", 2*time.Second)
		if err != nil {
			t.Fatalf("connecting from the root namespace to %s: %v", r.name, err)
		}
		c.Close()
		if d := time.Since(begin); d >= 5*time.Millisecond {
			t.Errorf("connect from the root namespace to %s took %s, want no delay", r.name, d)
		}
	}
}
