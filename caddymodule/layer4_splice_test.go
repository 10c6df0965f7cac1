package caddymodule

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair is a connected pair of TCP sockets on loopback.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// A spliced connection's bytes are counted while it flows (from the
// sockets' counters) and settled exactly when it ends: nothing counted
// twice, the matching bytes counted before the splice included once.
func TestSplicedPipeCountsWhileItFlows(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("bytes are counted while they flow on Linux only (TCP_INFO)")
	}
	client, down := tcpPair(t)
	up, instance := tcpPair(t)
	var in, out atomic.Uint64
	const base = 5 // read while matching, counted by the caller
	in.Add(base)
	if _, err := client.Write([]byte("hello")); err != nil { // the matched bytes, consumed below
		t.Fatal(err)
	}
	buf := make([]byte, base)
	if _, err := io.ReadFull(down, buf); err != nil {
		t.Fatal(err)
	}
	p := newSplicedPipe(down, up, &in, &out, base)
	if p == nil {
		t.Fatal("no spliced pipe between two TCP sockets")
	}
	done := make(chan struct{})
	go func() { p.run(); close(done) }()

	payload := make([]byte, 300_000)
	if _, err := client.Write(payload); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(instance, payload); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 70_000)
	if _, err := instance.Write(reply); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, reply); err != nil {
		t.Fatal(err)
	}
	p.catchUp()
	if in.Load() != base+300_000 || out.Load() != 70_000 {
		t.Fatalf("while open: in %d out %d, want %d and %d", in.Load(), out.Load(), base+300_000, 70_000)
	}
	p.catchUp() // again: nothing new, nothing added
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(instance); err != nil {
		t.Fatal(err)
	}
	if err := instance.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pipe did not end after both sides closed")
	}
	if in.Load() != base+300_000 || out.Load() != 70_000 {
		t.Fatalf("after the end: in %d out %d, want %d and %d", in.Load(), out.Load(), base+300_000, 70_000)
	}
}
