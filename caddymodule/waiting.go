package caddymodule

import (
	"context"
	"hash/maphash"
	"sync"
)

// The round trips waiting for their response headers, by endpoint, for
// the health checker to abandon when a probe finds their endpoint failing
// (health.go). Every proxied request registers and unregisters once, and
// abandoning is rare, so the registry is built for the first two: the
// endpoints are spread over shards with a lock each (requests to
// different endpoints never meet on one lock), each endpoint keeps its
// list between requests (a registration allocates nothing but its
// waiter), and the list is linked through the waiters themselves, so
// that leaving it is two pointer moves, with no map to grow or shrink.

// waitShards is the number of locks the endpoints are spread over.
const waitShards = 32

// waitRegistry holds the waiting round trips. Its zero value is ready.
type waitRegistry struct {
	seed   maphash.Seed
	once   sync.Once
	shards [waitShards]waitShard
}

type waitShard struct {
	mu sync.Mutex
	// lists holds, per endpoint dial address, its waiting round trips.
	lists map[string]*waitList
	// pad keeps neighbouring shards' locks off one cache line.
	_ [48]byte
}

// waitList is one endpoint's waiting round trips, newest first.
type waitList struct{ head *waiter }

// waiter is one round trip waiting for its response headers.
type waiter struct {
	abandon    context.CancelCauseFunc
	list       *waitList
	prev, next *waiter
}

func (g *waitRegistry) shard(addr string) *waitShard {
	g.once.Do(func() { g.seed = maphash.MakeSeed() })
	return &g.shards[maphash.String(g.seed, addr)%waitShards]
}

// add registers a round trip to addr, which abandon ends, until remove.
func (g *waitRegistry) add(addr string, abandon context.CancelCauseFunc) *waiter {
	w := &waiter{abandon: abandon}
	s := g.shard(addr)
	s.mu.Lock()
	l := s.lists[addr]
	if l == nil {
		if s.lists == nil {
			s.lists = map[string]*waitList{}
		}
		l = &waitList{}
		s.lists[addr] = l
	}
	w.list, w.next = l, l.head
	if l.head != nil {
		l.head.prev = w
	}
	l.head = w
	s.mu.Unlock()
	return w
}

// remove unregisters w (a round trip to addr), unless abandon already
// took it.
func (g *waitRegistry) remove(addr string, w *waiter) {
	s := g.shard(addr)
	s.mu.Lock()
	if l := w.list; l != nil {
		if w.prev != nil {
			w.prev.next = w.next
		} else {
			l.head = w.next
		}
		if w.next != nil {
			w.next.prev = w.prev
		}
		w.list, w.prev, w.next = nil, nil, nil
	}
	s.mu.Unlock()
}

// abandon ends every round trip waiting on addr with cause, and returns
// how many there were.
func (g *waitRegistry) abandon(addr string, cause error) int {
	// The waiters are taken under the lock (a round trip that ends now
	// removes itself from the same list) and ended outside it.
	s := g.shard(addr)
	s.mu.Lock()
	var taken []context.CancelCauseFunc
	if l := s.lists[addr]; l != nil {
		for w := l.head; w != nil; {
			next := w.next
			taken = append(taken, w.abandon)
			w.list, w.prev, w.next = nil, nil, nil
			w = next
		}
		l.head = nil
	}
	s.mu.Unlock()
	for _, abandon := range taken {
		abandon(cause)
	}
	return len(taken)
}

// waitingOn is how many round trips wait on addr now.
func (g *waitRegistry) waitingOn(addr string) int {
	s := g.shard(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if l := s.lists[addr]; l != nil {
		for w := l.head; w != nil; w = w.next {
			n++
		}
	}
	return n
}

// prune drops the empty lists of endpoints keep does not want kept.
func (g *waitRegistry) prune(keep func(addr string) bool) {
	for i := range g.shards {
		s := &g.shards[i]
		s.mu.Lock()
		for addr, l := range s.lists {
			if l.head == nil && !keep(addr) {
				delete(s.lists, addr)
			}
		}
		s.mu.Unlock()
	}
}
