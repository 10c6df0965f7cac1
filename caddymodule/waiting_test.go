package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// A round trip registered on an endpoint is abandoned with the cause when
// its endpoint is, and not when another endpoint is; one that left first
// is not; what abandon took, remove leaves alone; an emptied list of an
// endpoint no longer probed is pruned, one still probed is kept.
func TestWaitRegistryAbandonsTheEndpointsRoundTrips(t *testing.T) {
	var g waitRegistry
	type trip struct {
		ctx context.Context
		w   *waiter
	}
	start := func(addr string) trip {
		ctx, abandon := context.WithCancelCause(context.Background())
		return trip{ctx, g.add(addr, abandon)}
	}
	a1, a2, a3 := start("10.0.0.1:80"), start("10.0.0.1:80"), start("10.0.0.1:80")
	b := start("10.0.0.2:80")
	g.remove("10.0.0.1:80", a2.w) // the middle one got its headers
	if n := g.waitingOn("10.0.0.1:80"); n != 2 {
		t.Fatalf("%d waiting on 10.0.0.1:80, want 2", n)
	}
	cause := errors.New("probe failed")
	if n := g.abandon("10.0.0.1:80", cause); n != 2 {
		t.Fatalf("abandoned %d, want 2", n)
	}
	for i, tr := range []trip{a1, a3} {
		if context.Cause(tr.ctx) != cause {
			t.Errorf("round trip %d: cause %v, want %v", i, context.Cause(tr.ctx), cause)
		}
	}
	if a2.ctx.Err() != nil || b.ctx.Err() != nil {
		t.Errorf("a round trip that left (%v) or waits on another endpoint (%v) was abandoned", a2.ctx.Err(), b.ctx.Err())
	}
	g.remove("10.0.0.1:80", a1.w) // after abandon: nothing to do
	if n := g.waitingOn("10.0.0.1:80"); n != 0 {
		t.Errorf("%d waiting on the abandoned endpoint, want 0", n)
	}
	g.prune(func(addr string) bool { return addr == "10.0.0.2:80" })
	if s := g.shard("10.0.0.1:80"); s.lists["10.0.0.1:80"] != nil {
		t.Error("the emptied list of an endpoint no longer probed was kept")
	}
	g.remove("10.0.0.2:80", b.w)
	g.prune(func(addr string) bool { return addr == "10.0.0.2:80" })
	if s := g.shard("10.0.0.2:80"); s.lists["10.0.0.2:80"] == nil {
		t.Error("the empty list of an endpoint still probed was dropped")
	}
}

// Round trips registering and leaving from many goroutines at once, on a
// few endpoints, leave nothing behind (run with -race).
func TestWaitRegistryConcurrent(t *testing.T) {
	var g waitRegistry
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 2000; j++ {
				addr := fmt.Sprintf("10.0.0.%d:80", j%3)
				_, abandon := context.WithCancelCause(context.Background())
				w := g.add(addr, abandon)
				if j%97 == 0 {
					g.abandon(addr, errors.New("probe failed"))
				}
				g.remove(addr, w)
			}
		}()
	}
	wg.Wait()
	for i := 0; i < 3; i++ {
		if n := g.waitingOn(fmt.Sprintf("10.0.0.%d:80", i)); n != 0 {
			t.Errorf("%d left waiting on endpoint %d", n, i)
		}
	}
}

// BenchmarkWaitRegistry is one round trip's registration and removal,
// from parallel goroutines on two endpoints.
func BenchmarkWaitRegistry(b *testing.B) {
	var g waitRegistry
	_, abandon := context.WithCancelCause(context.Background())
	addrs := [2]string{"10.0.0.1:80", "10.0.0.2:80"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			addr := addrs[i&1]
			g.remove(addr, g.add(addr, abandon))
			i++
		}
	})
}
