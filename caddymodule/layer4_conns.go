package caddymodule

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Layer-4 connections and their drains. Every proxied connection is
// registered under its service and instance. When a view no longer routes
// an instance for its service, its connections keep flowing until they
// close or the service's drain timeout, counted from the moment the
// gateway saw the instance leave, has passed; then the gateway closes them.
// What drains is reported in the gateway's observation (L4Draining) as of
// the view reported, so that a deploy stops an old instance only once no
// gateway has a connection to it. The registry lives with the shared
// projection: a config reload neither ends a connection nor a drain.

// l4Counters are one service's layer-4 counters, plain atomics on the
// connection path.
type l4Counters struct {
	open                   atomic.Int64
	total                  atomic.Uint64
	bytesIn, bytesOut      atomic.Uint64
	connectErrors, refused atomic.Uint64
}

// snapshot is the counters as a traffic report carries them; nil for a
// service that never had a layer-4 connection.
func (c *l4Counters) snapshot() *store.L4Traffic {
	t := &store.L4Traffic{Open: c.open.Load(), Total: c.total.Load(), BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(),
		ConnectErrors: c.connectErrors.Load(), Refused: c.refused.Load()}
	if t.Open == 0 && t.Total == 0 && t.ConnectErrors == 0 && t.Refused == 0 {
		return nil
	}
	return t
}

// l4InstKey names an instance of a service.
type l4InstKey struct{ service, instance string }

// l4Inst is the open connections to one instance of one service.
type l4Inst struct {
	namespace, name string
	// drain is the service's drain timeout as of the latest connection.
	drain time.Duration
	conns map[*l4Conn]struct{}
	// until is when its connections are closed, set when the gateway saw
	// the instance leave its service's routing; zero while routed.
	until time.Time
}

// l4Conn is one proxied connection; close ends it from the drain side.
type l4Conn struct {
	key   l4InstKey
	dial  string
	close func()
	// spliced is the connection's kernel copy once it runs, whose bytes
	// catchUp counts while it flows.
	spliced atomic.Pointer[splicedPipe]
}

// l4Registry holds the open layer-4 connections by instance, and how many
// each dial address has, for least-open picks.
type l4Registry struct {
	mu     sync.Mutex
	byInst map[l4InstKey]*l4Inst
	byDial map[string]int
	// rr spreads ties between equally loaded candidates.
	rr uint64
	// drained, when set, is called when the last connection to a
	// draining instance ends (the observation is written again).
	drained func()
}

func newL4Registry() *l4Registry {
	return &l4Registry{byInst: map[l4InstKey]*l4Inst{}, byDial: map[string]int{}}
}

// pick reserves the candidate with the fewest open connections among
// dials, skipping those in tried; "" when none is left. A reservation
// is given back by release (a failed dial) or kept by register.
func (r *l4Registry) pick(dials []string, tried []string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rr++
	best, bestN := "", 0
	for i := range dials {
		d := dials[(i+int(r.rr%uint64(len(dials))))%len(dials)]
		if slices.Contains(tried, d) {
			continue
		}
		if n := r.byDial[d]; best == "" || n < bestN {
			best, bestN = d, n
		}
	}
	if best != "" {
		r.byDial[best]++
	}
	return best
}

// release gives back a reservation pick made.
func (r *l4Registry) release(dial string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop(dial)
}

func (r *l4Registry) drop(dial string) {
	if r.byDial[dial]--; r.byDial[dial] <= 0 {
		delete(r.byDial, dial)
	}
}

// register records a connection to instance of svc through dial (whose
// reservation it keeps); close ends it when its drain is over.
func (r *l4Registry) register(svc *projection.Service, instance, dial string, close func()) *l4Conn {
	c := &l4Conn{key: l4InstKey{svc.Key(), instance}, dial: dial, close: close}
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.byInst[c.key]
	if in == nil {
		in = &l4Inst{namespace: svc.Namespace, name: svc.Name, conns: map[*l4Conn]struct{}{}}
		r.byInst[c.key] = in
	}
	in.drain = svc.Layer4.Drain()
	in.conns[c] = struct{}{}
	return c
}

// catchUp counts the bytes the spliced connections moved so far, for a
// report or a scrape. The sockets are read outside the lock: a
// getsockopt per connection.
func (r *l4Registry) catchUp() {
	r.mu.Lock()
	var pipes []*splicedPipe
	for _, in := range r.byInst {
		for c := range in.conns {
			if p := c.spliced.Load(); p != nil {
				pipes = append(pipes, p)
			}
		}
	}
	r.mu.Unlock()
	for _, p := range pipes {
		p.catchUp()
	}
}

// unregister forgets a connection that ended.
func (r *l4Registry) unregister(c *l4Conn) {
	r.mu.Lock()
	r.drop(c.dial)
	last := false
	if in := r.byInst[c.key]; in != nil {
		delete(in.conns, c)
		if len(in.conns) == 0 {
			delete(r.byInst, c.key)
			last = !in.until.IsZero()
		}
	}
	r.mu.Unlock()
	if last && r.drained != nil {
		r.drained()
	}
}

// routed says whether v routes instance for the service in in.
func routed(v *projection.View, in *l4Inst, instance string) bool {
	s, ok := v.Service(in.namespace, in.name)
	if !ok {
		return false
	}
	for _, e := range s.Endpoints {
		if e.InstanceID == instance {
			return true
		}
	}
	return false
}

// sweep follows v: an instance v no longer routes starts its drain (now
// plus its service's drain timeout), one routed again stops it, and the
// connections of an instance whose drain is over are closed. It reports
// whether the set of draining instances changed.
func (r *l4Registry) sweep(v *projection.View, now time.Time) (changed bool) {
	var overdue []*l4Conn
	r.mu.Lock()
	for k, in := range r.byInst {
		switch {
		case routed(v, in, k.instance):
			if !in.until.IsZero() {
				in.until, changed = time.Time{}, true
			}
		case in.until.IsZero():
			in.until, changed = now.Add(in.drain), true
		case !now.Before(in.until):
			for c := range in.conns {
				overdue = append(overdue, c)
			}
		}
	}
	r.mu.Unlock()
	// Closing ends the connection's copies; its handler unregisters it.
	for _, c := range overdue {
		c.close()
	}
	return changed || len(overdue) > 0
}

// draining lists the instances v does not route to which connections
// are open, as of v: an instance the sweep has not seen leave yet drains
// until now plus its drain timeout.
func (r *l4Registry) draining(v *projection.View, now time.Time) []store.L4Drain {
	r.mu.Lock()
	var out []store.L4Drain
	for k, in := range r.byInst {
		if len(in.conns) == 0 || routed(v, in, k.instance) {
			continue
		}
		until := in.until
		if until.IsZero() {
			until = now.Add(in.drain)
		}
		out = append(out, store.L4Drain{Namespace: in.namespace, Service: in.name, Instance: k.instance, Conns: len(in.conns), Until: until.UTC()})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b store.L4Drain) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Service, b.Service), cmp.Compare(a.Instance, b.Instance))
	})
	if len(out) > store.MaxL4Reported {
		out = out[:store.MaxL4Reported]
	}
	return out
}

// openTo is the open connections to each instance of service key.
func (r *l4Registry) openTo(key string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[string]int
	for k, in := range r.byInst {
		if k.service == key {
			if out == nil {
				out = map[string]int{}
			}
			out[k.instance] = len(in.conns)
		}
	}
	return out
}

// closeAll ends every connection: the last config using the projection
// is gone.
func (r *l4Registry) closeAll() {
	var all []*l4Conn
	r.mu.Lock()
	for _, in := range r.byInst {
		for c := range in.conns {
			all = append(all, c)
		}
	}
	r.mu.Unlock()
	for _, c := range all {
		c.close()
	}
}
