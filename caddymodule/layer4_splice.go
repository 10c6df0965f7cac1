package caddymodule

import (
	"io"
	"net"
	"sync/atomic"
)

// TCP between two sockets is copied by the kernel (io.Copy between
// *net.TCPConn splices), which moves about a fifth more through a
// gateway here than a read/write loop through user space does (bench-l4's
// bare proxy against the gateway's loop: 0.64–0.68x of a direct
// connection against 0.52–0.56x). A splice reports what it moved only
// when it ends, so a long connection's bytes are counted while it flows
// from its sockets' own counters (TCP_INFO's bytes received, read when
// the traffic is reported), and settled with the copy's count when it
// ends.

// byteFlow is one direction of a spliced connection: the bytes received
// on src, counted into n.
type byteFlow struct {
	src *net.TCPConn
	n   *atomic.Uint64
	// counted is what this flow has added to n: its base (bytes read from
	// src and counted before the splice) plus what was spliced or seen
	// received since.
	counted atomic.Uint64
}

// upTo counts the flow up to total bytes; counts never go back.
func (f *byteFlow) upTo(total uint64) {
	for {
		c := f.counted.Load()
		if total <= c {
			return
		}
		if f.counted.CompareAndSwap(c, total) {
			f.n.Add(total - c)
			return
		}
	}
}

// catchUp counts what the kernel received on src so far.
func (f *byteFlow) catchUp() {
	if got, ok := bytesReceived(f.src); ok {
		f.upTo(got)
	}
}

// splicedPipe is a TCP connection copied by the kernel both ways.
type splicedPipe struct {
	in, out byteFlow
}

// newSplicedPipe is the spliced pipe between down and up, nil unless both
// are TCP sockets. base is what was already read from down and counted
// (the bytes caddy-l4 read while matching).
func newSplicedPipe(down, up net.Conn, in, out *atomic.Uint64, base uint64) *splicedPipe {
	dt, ok1 := down.(*net.TCPConn)
	ut, ok2 := up.(*net.TCPConn)
	if !ok1 || !ok2 {
		return nil
	}
	p := &splicedPipe{in: byteFlow{src: dt, n: in}, out: byteFlow{src: ut, n: out}}
	p.in.counted.Store(base)
	return p
}

// catchUp counts both directions' bytes received so far.
func (p *splicedPipe) catchUp() {
	p.in.catchUp()
	p.out.catchUp()
}

// run copies both ways until both ends are done, half-closing each side
// when the other finished sending, and settles the counts.
func (p *splicedPipe) run() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, _ := io.Copy(p.in.src, p.out.src)
		p.out.upTo(uint64(n))
		_ = p.in.src.CloseWrite()
	}()
	base := p.in.counted.Load()
	n, _ := io.Copy(p.out.src, p.in.src)
	p.in.upTo(base + uint64(n))
	_ = p.out.src.CloseWrite()
	<-done
}
