package runtime

import (
	"context"
	"sync"
)

// coalescer makes one call per key for the callers that ask at the same
// time. A caller never shares a call that had already started when it
// asked: it joins the key's next call, which starts once the one under way
// ends. What a caller gets was thus read after it asked, as its own call
// would have been (a tag moved just before is seen), and any number of
// callers at once cost at most two calls instead of one each.
type coalescer[T any] struct {
	mu sync.Mutex
	// running is each key's call under way; queued is the call that
	// starts when it ends, the one new callers join.
	running, queued map[string]*call[T]
	// joined, if set, is told each time a caller joins a call (tests).
	joined func(key string)
}

// call is one call of a coalescer's function for one key.
type call[T any] struct {
	done chan struct{}
	// v and err are the call's result, written before done closes.
	v   T
	err error
	// waiters is how many callers wait for the call; cancel ends it once
	// it has started and none is left. Both guarded by coalescer.mu.
	waiters int
	cancel  context.CancelFunc
}

// do returns f(ctx, key) as a call made after do was called returns it,
// sharing that call with other callers of do for key. The call runs with
// the values of the ctx of the caller that queued it, but with no caller's
// deadline: it is cancelled when every caller waiting for it has given up.
func (c *coalescer[T]) do(ctx context.Context, key string, f func(context.Context, string) (T, error)) (T, error) {
	c.mu.Lock()
	if c.running == nil {
		c.running, c.queued = map[string]*call[T]{}, map[string]*call[T]{}
	}
	cl := c.queued[key]
	if cl == nil {
		cl = &call[T]{done: make(chan struct{})}
		c.queued[key] = cl
		go c.run(context.WithoutCancel(ctx), key, cl, c.running[key], f)
	}
	cl.waiters++
	joined := c.joined
	c.mu.Unlock()
	if joined != nil {
		joined(key)
	}
	select {
	case <-cl.done:
		return cl.v, cl.err
	case <-ctx.Done():
		c.mu.Lock()
		cl.waiters--
		if cl.waiters == 0 && cl.cancel != nil {
			cl.cancel()
		}
		c.mu.Unlock()
		var zero T
		return zero, ctx.Err()
	}
}

// run starts cl once prev (the key's call under way when cl was queued, or
// nil) has ended, and records its result. A call every caller gave up on
// before it started is not made.
func (c *coalescer[T]) run(base context.Context, key string, cl, prev *call[T], f func(context.Context, string) (T, error)) {
	if prev != nil {
		<-prev.done
	}
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	c.mu.Lock()
	delete(c.queued, key)
	c.running[key] = cl
	cl.cancel = cancel
	abandoned := cl.waiters == 0
	c.mu.Unlock()
	if abandoned {
		cl.err = context.Canceled
	} else {
		cl.v, cl.err = f(ctx, key)
	}
	c.mu.Lock()
	delete(c.running, key)
	c.mu.Unlock()
	close(cl.done)
}
