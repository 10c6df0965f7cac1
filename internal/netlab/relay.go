// Package netlab delays packets between the regions of a test lab. The
// kernel of the boxes the tests run on has no netem (only the tbf and htb
// qdiscs load), so the lab's inter-region round trip is made in user
// space: a router namespace sends only the packets that cross regions into
// a TUN device by policy routing, and a Relay reads each one, holds it for
// the one-way delay of its (source, destination) pair and writes it back,
// from where the kernel forwards it on. Packets within a pair keep their
// order; a pair no link names passes at once.
package netlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Link is the round trip between two networks; each direction is held for
// half of it.
type Link struct {
	A, B netip.Prefix
	RTT  time.Duration
}

// ParseLink reads "A,B=RTT", e.g. "10.215.1.0/24,10.215.2.0/24=30ms".
func ParseLink(s string) (Link, error) {
	nets, rtt, ok := cutLast(s, "=")
	if !ok {
		return Link{}, fmt.Errorf("parsing link %q: want A,B=RTT", s)
	}
	a, b, ok := cutLast(nets, ",")
	if !ok {
		return Link{}, fmt.Errorf("parsing link %q: want A,B=RTT", s)
	}
	var l Link
	var err error
	if l.A, err = netip.ParsePrefix(a); err != nil {
		return Link{}, fmt.Errorf("parsing link %q: %w", s, err)
	}
	if l.B, err = netip.ParsePrefix(b); err != nil {
		return Link{}, fmt.Errorf("parsing link %q: %w", s, err)
	}
	if l.RTT, err = time.ParseDuration(rtt); err != nil || l.RTT < 0 {
		return Link{}, fmt.Errorf("parsing link %q: round trip %q is not a duration of zero or more", s, rtt)
	}
	return l, nil
}

func cutLast(s, sep string) (string, string, bool) {
	for i := len(s) - len(sep); i >= 0; i-- {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return "", "", false
}

// Device is where the relay reads packets and writes them back: a TUN
// device (OpenTUN) in the lab. Read returns one IP packet; a Read that
// fails ends Run, so closing the device is how its owner stops it.
type Device interface {
	io.Reader
	io.Writer
}

// queueLen bounds the packets held per direction of a link: past it the
// relay drops, as a router's full queue does, rather than grow.
const queueLen = 8192

// Relay holds each packet read from a Device for its pair's one-way delay
// and writes it back.
type Relay struct {
	dev   Device
	dirs  []direction
	wmu   sync.Mutex // one write to the device at a time
	drops atomic.Uint64
}

// direction is one way of a link with the packets it holds, oldest first:
// the delay is the same for all of them, so a FIFO keeps both the order
// and the due times sorted.
type direction struct {
	from, to netip.Prefix
	delay    time.Duration
	queue    chan heldPacket
}

type heldPacket struct {
	due  time.Time
	data []byte
}

// NewRelay returns a relay over dev that delays what links name.
func NewRelay(dev Device, links []Link) *Relay {
	r := &Relay{dev: dev}
	for _, l := range links {
		for _, d := range [][2]netip.Prefix{{l.A, l.B}, {l.B, l.A}} {
			r.dirs = append(r.dirs, direction{from: d[0], to: d[1], delay: l.RTT / 2, queue: make(chan heldPacket, queueLen)})
		}
	}
	return r
}

// Drops is how many packets found their direction's queue full.
func (r *Relay) Drops() uint64 { return r.drops.Load() }

// Run relays until ctx ends or the device fails to read (closed); it
// returns once every goroutine it started has ended. Packets still held
// then are dropped.
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range r.dirs {
		wg.Add(1)
		go func(d *direction) {
			defer wg.Done()
			r.release(ctx, d)
		}(&r.dirs[i])
	}
	buf := make([]byte, 65536)
	for {
		n, err := r.dev.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("reading a packet: %w", err)
		}
		now := time.Now()
		pkt := append([]byte(nil), buf[:n]...)
		d := r.directionOf(pkt)
		if d == nil || d.delay == 0 {
			r.write(pkt)
			continue
		}
		select {
		case d.queue <- heldPacket{due: now.Add(d.delay), data: pkt}:
		default:
			r.drops.Add(1)
		}
	}
}

// release writes d's packets back as they fall due.
func (r *Relay) release(ctx context.Context, d *direction) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var p heldPacket
		select {
		case <-ctx.Done():
			return
		case p = <-d.queue:
		}
		if wait := time.Until(p.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		r.write(p.data)
	}
}

// write hands a packet back to the kernel; a packet it refuses is lost,
// as on a wire.
func (r *Relay) write(pkt []byte) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if _, err := r.dev.Write(pkt); err != nil {
		r.drops.Add(1)
	}
}

// directionOf is the direction an IPv4 or IPv6 packet travels, or nil.
func (r *Relay) directionOf(pkt []byte) *direction {
	src, dst, ok := addrs(pkt)
	if !ok {
		return nil
	}
	for i := range r.dirs {
		if d := &r.dirs[i]; d.from.Contains(src) && d.to.Contains(dst) {
			return d
		}
	}
	return nil
}

// addrs reads the source and destination of an IP packet.
func addrs(pkt []byte) (src, dst netip.Addr, ok bool) {
	if len(pkt) < 1 {
		return src, dst, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return src, dst, false
		}
		return netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20])), true
	case 6:
		if len(pkt) < 40 {
			return src, dst, false
		}
		return netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return src, dst, false
}
