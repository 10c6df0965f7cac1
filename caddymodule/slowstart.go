package caddymodule

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeplane/edgeplane/projection"
)

// Slow start, as Envoy's: an endpoint that becomes routable while the
// gateway runs gets a share of its service's requests that ramps from
// rampFloor of a full share to all of it over the service's slow_start
// window, so that a cold instance (empty caches, connection pools, a JIT
// not yet warm) is not handed a full share at once.
//
// The gateway thins rather than weighs: each request's candidate list
// keeps a ramping endpoint with probability rampFraction(age), and the
// load balancer picks among what is kept, so with n endpoints and random
// or least_conn selection a ramping one gets about fraction/n of the
// requests. Thinning works with every selection policy Caddy has,
// without a weighted policy of our own.
//
// "Newly routable" is seen by this gateway: an endpoint of a service it
// already served that was not in the service's previous view. The
// endpoints of every view up to the gateway's first load from the store
// (its routing snapshot, then the first view loaded) are established, so
// a gateway restart ramps nothing; so are those of a service new to the
// gateway, which has nothing established to take their share. An endpoint
// that leaves its service is forgotten: it ramps again when it comes back.

// rampFloor is the share of a full share a newly routable endpoint starts
// at.
const rampFloor = 0.1

// rampFraction is the share of a full share an endpoint routable for age
// gets under a window: from rampFloor at 0 to 1 at window, linearly.
func rampFraction(age, window time.Duration) float64 {
	if window <= 0 || age >= window {
		return 1
	}
	if age <= 0 {
		return rampFloor
	}
	return rampFloor + (1-rampFloor)*float64(age)/float64(window)
}

// slowStart tracks when each endpoint became routable and thins request
// candidate lists by it. Create it with newSlowStart, feed it views with
// run (or observe); thin may be called from any goroutine, and on a nil
// *slowStart.
type slowStart struct {
	// mu guards what observe keeps between views.
	mu sync.Mutex
	// baseline is set once a view loaded from the store (not stale) was
	// observed: endpoints seen until then are established.
	baseline bool
	services map[string]*serviceSeen

	// ramping maps the dial address of each endpoint still ramping to
	// when it became routable; nil when none is, which thin checks first.
	// Replaced whole, never changed.
	ramping atomic.Pointer[map[string]rampEntry]
}

// rampEntry is when an endpoint became routable and its service's window.
type rampEntry struct {
	since  time.Time
	window time.Duration
}

// serviceSeen is what observe knows of one service.
type serviceSeen struct {
	svc *projection.Service
	// since maps each endpoint's instance ID to when it became routable;
	// the zero time for an established one; ramps counts the others.
	since map[string]time.Time
	ramps int
}

func newSlowStart() *slowStart {
	return &slowStart{services: map[string]*serviceSeen{}}
}

// run observes every view swapped in, and drops endpoints from the
// ramping set as their windows end, until ctx ends.
func (s *slowStart) run(ctx context.Context, view func() *projection.View, changed func() <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ch := changed()
		next := s.observe(view(), time.Now())
		var wake <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-wake:
		}
		timer.Stop()
	}
}

// observe takes in v, seen at now: endpoints new to their service since
// the last view observed start ramping, those gone are forgotten. It
// returns when the next ramp ends (zero when nothing ramps).
func (s *slowStart) observe(v *projection.View, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	established := !s.baseline
	if !v.Stale {
		s.baseline = true
	}
	present := make(map[string]bool, len(s.services))
	for _, svc := range v.Services() {
		key := svc.Key()
		present[key] = true
		seen := s.services[key]
		if seen != nil && seen.svc == svc {
			continue // a Service never changes: nor do its endpoints
		}
		next := &serviceSeen{svc: svc, since: make(map[string]time.Time, len(svc.Endpoints))}
		for _, e := range svc.Endpoints {
			t, ok := seen.sinceOf(e.InstanceID)
			if !ok && !established && seen != nil {
				t = now
			}
			next.since[e.InstanceID] = t
			if !t.IsZero() {
				next.ramps++
			}
		}
		s.services[key] = next
	}
	for key := range s.services {
		if !present[key] {
			delete(s.services, key)
		}
	}
	return s.publishRamping(now)
}

// sinceOf is when instance became routable in the service, if it is in
// it; a nil seen has nothing.
func (seen *serviceSeen) sinceOf(instance string) (time.Time, bool) {
	if seen == nil {
		return time.Time{}, false
	}
	t, ok := seen.since[instance]
	return t, ok
}

// publishRamping replaces the ramping set with the endpoints whose
// windows have not ended at now, marking the others established, and
// returns when the first of those left ends. s.mu is held.
func (s *slowStart) publishRamping(now time.Time) time.Time {
	var ramping map[string]rampEntry
	var next time.Time
	for _, seen := range s.services {
		if seen.ramps == 0 {
			continue
		}
		window := seen.svc.SlowStart
		for _, e := range seen.svc.Endpoints {
			t := seen.since[e.InstanceID]
			if t.IsZero() {
				continue
			}
			end := t.Add(window)
			if window <= 0 || !now.Before(end) {
				seen.since[e.InstanceID] = time.Time{}
				seen.ramps--
				continue
			}
			if ramping == nil {
				ramping = map[string]rampEntry{}
			}
			ramping[net.JoinHostPort(e.Address, strconv.Itoa(e.Port))] = rampEntry{since: t, window: window}
			if next.IsZero() || end.Before(next) {
				next = end
			}
		}
	}
	if ramping == nil {
		s.ramping.Store(nil)
	} else {
		s.ramping.Store(&ramping)
	}
	return next
}

// thin returns dials (the dial addresses of the endpoints of svc a
// request may go to) with each ramping endpoint kept with the
// probability of its share (rampFraction). It never returns an empty
// list for a non-empty one (when every endpoint was dropped, all go
// back), and returns dials itself, without allocating, when none of
// them ramps. The result may be dials: never change it.
func (s *slowStart) thin(svc *projection.Service, dials []string) []string {
	if s == nil || svc.SlowStart <= 0 || len(dials) < 2 {
		return dials
	}
	rp := s.ramping.Load()
	if rp == nil {
		return dials
	}
	ramping := *rp
	var out []string
	for i, d := range dials {
		r, ok := ramping[d]
		if !ok || rand.Float64() < rampFraction(time.Since(r.since), svc.SlowStart) {
			if out != nil {
				out = append(out, d)
			}
			continue
		}
		if out == nil {
			out = make([]string, i, len(dials)-1)
			copy(out, dials[:i])
		}
	}
	if len(out) == 0 {
		return dials
	}
	return out
}

// thinRamping drops, from a request's final dial list, endpoints still
// ramping up by their share (slowStart.thin).
func (a *App) thinRamping(svc *projection.Service, dials []string) []string {
	return a.shared.slow.thin(svc, dials)
}

// rampingNow maps the dial address of each endpoint ramping now to its
// share of a full share, for the admin API; nil when none is.
func (s *slowStart) rampingNow() map[string]float64 {
	if s == nil {
		return nil
	}
	rp := s.ramping.Load()
	if rp == nil {
		return nil
	}
	out := make(map[string]float64, len(*rp))
	for d, r := range *rp {
		out[d] = rampFraction(time.Since(r.since), r.window)
	}
	return out
}
