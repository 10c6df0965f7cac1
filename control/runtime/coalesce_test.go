package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a coalescer function whose calls the test lets run one by one:
// each call says it started on started, then returns its number (from 1)
// once release lets it, or its context's error.
type gate struct {
	calls   atomic.Int32
	started chan int32
	release chan struct{}
}

func newGate() *gate {
	return &gate{started: make(chan int32, 10), release: make(chan struct{})}
}

func (g *gate) f(ctx context.Context, _ string) (int32, error) {
	n := g.calls.Add(1)
	g.started <- n
	select {
	case <-g.release:
		return n, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

type result struct {
	n   int32
	err error
}

// ask calls c.do for "k" in a goroutine and returns where its result
// comes, once the call is joined (the coalescer's joined hook says so).
func ask(ctx context.Context, c *coalescer[int32], g *gate, joined <-chan string) <-chan result {
	out := make(chan result, 1)
	go func() {
		n, err := c.do(ctx, "k", g.f)
		out <- result{n, err}
	}()
	<-joined
	return out
}

func within(t *testing.T, what string, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return result{}
	}
}

// Callers that ask while a call runs share the next call, never the one
// under way: three callers, two calls, and the late two get the second.
func TestCoalescerSharesOnlyCallsNotStarted(t *testing.T) {
	g := newGate()
	joined := make(chan string, 10)
	c := &coalescer[int32]{joined: func(k string) { joined <- k }}
	ctx := context.Background()

	first := ask(ctx, c, g, joined)
	if n := <-g.started; n != 1 {
		t.Fatalf("first call is number %d", n)
	}
	late1, late2 := ask(ctx, c, g, joined), ask(ctx, c, g, joined)
	g.release <- struct{}{}
	if r := within(t, "the first caller", first); r.n != 1 || r.err != nil {
		t.Fatalf("first caller got %+v, want call 1", r)
	}
	if n := <-g.started; n != 2 {
		t.Fatalf("second call is number %d", n)
	}
	g.release <- struct{}{}
	for _, ch := range []<-chan result{late1, late2} {
		if r := within(t, "a late caller", ch); r.n != 2 || r.err != nil {
			t.Fatalf("late caller got %+v, want call 2 (one that started after it asked)", r)
		}
	}
	if n := g.calls.Load(); n != 2 {
		t.Fatalf("%d calls for three callers, want 2", n)
	}
}

// A caller that gives up gets its context's error at once; a call nobody
// waits for any more is cancelled (under way) or never made (queued), and
// the next caller gets a call of its own.
func TestCoalescerCallerGivesUp(t *testing.T) {
	g := newGate()
	joined := make(chan string, 10)
	c := &coalescer[int32]{joined: func(k string) { joined <- k }}

	// The only caller of a running call leaves: the call is cancelled.
	ctx1, cancel1 := context.WithCancel(context.Background())
	first := ask(ctx1, c, g, joined)
	<-g.started
	// One who queued behind it leaves too, before its call starts.
	ctx2, cancel2 := context.WithCancel(context.Background())
	queued := ask(ctx2, c, g, joined)
	cancel2()
	if r := within(t, "the queued caller", queued); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("queued caller that gave up got %+v", r)
	}
	cancel1()
	if r := within(t, "the first caller", first); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("first caller that gave up got %+v", r)
	}

	// A new caller is not handed a cancelled call: it gets call 2 (the
	// abandoned queued one was never made).
	fresh := ask(context.Background(), c, g, joined)
	if n := <-g.started; n != 2 {
		t.Fatalf("the fresh caller's call is number %d, want 2", n)
	}
	g.release <- struct{}{}
	if r := within(t, "the fresh caller", fresh); r.n != 2 || r.err != nil {
		t.Fatalf("fresh caller got %+v", r)
	}
}

// The caller that queued a call giving up does not end it for the others
// who joined it: the call runs without any one caller's cancellation.
func TestCoalescerLeaderLeaves(t *testing.T) {
	g := newGate()
	joined := make(chan string, 10)
	c := &coalescer[int32]{joined: func(k string) { joined <- k }}

	first := ask(context.Background(), c, g, joined)
	<-g.started
	// Call 2 is queued by leader (whose context it runs with) and joined
	// by other; the leader leaves before it starts.
	ctx, cancel := context.WithCancel(context.Background())
	leader := ask(ctx, c, g, joined)
	other := ask(context.Background(), c, g, joined)
	cancel()
	if r := within(t, "the leader", leader); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the leader that gave up got %+v", r)
	}
	g.release <- struct{}{}
	within(t, "the first caller", first)
	if n := <-g.started; n != 2 {
		t.Fatalf("second call is number %d", n)
	}
	g.release <- struct{}{}
	if r := within(t, "the other caller", other); r.n != 2 || r.err != nil {
		t.Fatalf("the caller left waiting got %+v, want call 2", r)
	}
}
