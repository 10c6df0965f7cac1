package netlab

import (
	"context"
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// pipeDevice is a Device in memory: the test sends packets in, the relay's
// writes come out with the time they were written.
type pipeDevice struct {
	in  chan []byte
	mu  sync.Mutex
	out []written
}

type written struct {
	at  time.Time
	pkt []byte
}

func (d *pipeDevice) Read(b []byte) (int, error) {
	p, ok := <-d.in
	if !ok {
		return 0, io.EOF
	}
	return copy(b, p), nil
}

func (d *pipeDevice) Write(b []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.out = append(d.out, written{time.Now(), append([]byte(nil), b...)})
	return len(b), nil
}

func (d *pipeDevice) written() []written {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]written(nil), d.out...)
}

// ipv4 is a bare IPv4 header from src to dst, seq in its ID field.
func ipv4(src, dst string, seq uint16) []byte {
	p := make([]byte, 20)
	p[0] = 0x45
	p[4], p[5] = byte(seq>>8), byte(seq)
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	return p
}

func seqOf(p []byte) uint16 { return uint16(p[4])<<8 | uint16(p[5]) }

func TestRelayHoldsEachDirectionForHalfItsRoundTripInOrder(t *testing.T) {
	links := []Link{
		{A: netip.MustParsePrefix("10.1.1.0/24"), B: netip.MustParsePrefix("10.1.2.0/24"), RTT: 60 * time.Millisecond},
		{A: netip.MustParsePrefix("10.1.1.0/24"), B: netip.MustParsePrefix("10.1.3.0/24"), RTT: 160 * time.Millisecond},
	}
	dev := &pipeDevice{in: make(chan []byte)}
	r := NewRelay(dev, links)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	sent := map[uint16]time.Time{}
	want := map[uint16]time.Duration{}
	send := func(src, dst string, seq uint16, delay time.Duration) {
		sent[seq] = time.Now()
		want[seq] = delay
		dev.in <- ipv4(src, dst, seq)
	}
	for i := uint16(0); i < 50; i++ {
		send("10.1.1.5", "10.1.2.7", 1000+i, 30*time.Millisecond) // ams -> fra
		send("10.1.3.9", "10.1.1.5", 2000+i, 80*time.Millisecond) // tyo -> ams
		send("10.1.2.7", "10.1.2.8", 3000+i, 0)                   // within fra: no link
		time.Sleep(time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(dev.written()) < 150 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	close(dev.in)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	out := dev.written()
	if len(out) != 150 {
		t.Fatalf("relay wrote %d packets, want 150", len(out))
	}
	last := map[uint16]uint16{} // per direction (seq/1000): the last seq seen
	for _, w := range out {
		seq := seqOf(w.pkt)
		held := w.at.Sub(sent[seq])
		// The timer wakes a little late on a busy box, never early.
		if held < want[seq] || held > want[seq]+20*time.Millisecond {
			t.Errorf("packet %d held %s, want %s", seq, held, want[seq])
		}
		if prev, ok := last[seq/1000]; ok && seq < prev {
			t.Errorf("packet %d written after %d: order lost within a direction", seq, prev)
		}
		last[seq/1000] = seq
	}
	if r.Drops() != 0 {
		t.Errorf("%d packets dropped", r.Drops())
	}
}

func TestParseLink(t *testing.T) {
	l, err := ParseLink("10.215.1.0/24,10.215.2.0/24=30ms")
	if err != nil {
		t.Fatal(err)
	}
	if l.A.String() != "10.215.1.0/24" || l.B.String() != "10.215.2.0/24" || l.RTT != 30*time.Millisecond {
		t.Errorf("parsed %+v", l)
	}
	for _, bad := range []string{"10.215.1.0/24=30ms", "10.215.1.0/24,10.215.2.0/24", "10.215.1.0/24,nope=30ms", "10.215.1.0/24,10.215.2.0/24=-1ms", "a,b=fast"} {
		if _, err := ParseLink(bad); err == nil {
			t.Errorf("ParseLink(%q): no error", bad)
		}
	}
}
