package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Active health checks for the projection's endpoints. Caddy's own active
// checks run only for static upstreams, and its passive checks keep their
// state on dynamic upstreams only while some request refers to them, so
// neither notices an instance whose machine froze: its kernel still
// accepts connections and nothing ever answers. The gateway therefore
// probes every routable endpoint itself, at its service's readiness path
// (a TCP connect when there is none), and the upstream source sets aside
// the endpoints whose last probe failed, as long as one of the service's
// endpoints is left; when none is, it serves them all (fail open) and
// says so.

// A request already waiting on an endpoint when a probe finds it dead
// would wait until its client gives up: nothing in the proxy notices. The
// handler's transport therefore registers each round trip, until its
// response headers arrive, with the checker, which abandons those on an
// endpoint as soon as a probe finds it failing, provided the service has
// another endpoint to retry on. The proxy counts the abandoned attempt
// as a failure and retries it as it retries any failed attempt (GET by
// default); a response that has begun is never cut.

// Default probe settings.
const (
	DefaultHealthInterval = time.Second
	DefaultHealthTimeout  = time.Second
)

// probeConcurrency bounds the probes in flight at once.
const probeConcurrency = 64

// healthChecker probes endpoints and remembers which failed.
type healthChecker struct {
	interval, timeout time.Duration
	view              func() *projection.View
	logger            *zap.Logger
	client            *http.Client

	mu sync.RWMutex
	// down maps an endpoint's dial address to why its last probe failed
	// and since when.
	down map[string]setAside
	// failOpen names the services served although every endpoint failed,
	// so that it is logged once per episode.
	failOpen map[string]bool
	// anyAside is set while down or failOpen holds anything (noteAside),
	// for the request path to skip the lock when neither does.
	anyAside atomic.Bool

	// waiting holds the round trips waiting for their response headers
	// (waiting.go).
	waiting waitRegistry
}

// errAbandoned is why a round trip was abandoned. It is deliberately not
// context.Canceled, which the proxy takes for a client that went away and
// neither retries nor counts against the upstream.
type errAbandoned struct{ addr, reason string }

func (e *errAbandoned) Error() string {
	return fmt.Sprintf("abandoned waiting for %s: %s", e.addr, e.reason)
}

// setAside is why an endpoint gets no new requests.
type setAside struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

func newHealthChecker(interval, timeout time.Duration, view func() *projection.View, logger *zap.Logger) *healthChecker {
	return &healthChecker{
		interval: interval, timeout: timeout, view: view, logger: logger,
		client: &http.Client{
			Timeout: timeout,
			// A probe is one request on a fresh connection: a reused one
			// could outlive the instance that answered it.
			Transport: &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: timeout}).DialContext},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		down:     map[string]setAside{},
		failOpen: map[string]bool{},
	}
}

// run probes every interval until ctx ends.
func (h *healthChecker) run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		h.probeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type probeTarget struct{ addr, path, instance, service string }

// probeAll probes every endpoint of the current view once, in parallel,
// and replaces what is known about them.
func (h *healthChecker) probeAll(ctx context.Context) {
	seen := map[string]probeTarget{}
	endpoints := map[string][]string{} // by service
	for _, s := range h.view().Services() {
		if udpOnly(s) {
			continue // nothing a TCP connect could probe
		}
		for _, e := range s.Endpoints {
			addr := net.JoinHostPort(e.Address, strconv.Itoa(e.Port))
			seen[addr] = probeTarget{addr: addr, path: s.HealthPath, instance: e.InstanceID, service: s.Key()}
			endpoints[s.Key()] = append(endpoints[s.Key()], addr)
		}
	}
	type result struct {
		t   probeTarget
		err error
	}
	results := make(chan result, len(seen))
	sem := make(chan struct{}, probeConcurrency)
	var wg sync.WaitGroup
	for _, t := range seen {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			results <- result{t, h.probe(ctx, t)}
		}()
	}
	wg.Wait()
	close(results)
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	next := make(map[string]setAside, len(h.down))
	var newlyDown []probeTarget
	for r := range results {
		if r.err == nil {
			if _, was := h.down[r.t.addr]; was {
				h.logger.Info("endpoint healthy again", zap.String("instance", r.t.instance), zap.String("addr", r.t.addr))
			}
			continue
		}
		prev, was := h.down[r.t.addr]
		if !was {
			prev = setAside{Since: now}
			h.logger.Warn("endpoint failed its health check; no new requests go to it",
				zap.String("instance", r.t.instance), zap.String("addr", r.t.addr), zap.Error(r.err))
			newlyDown = append(newlyDown, r.t)
		}
		prev.Reason = "health check failed: " + r.err.Error()
		next[r.t.addr] = prev
	}
	h.down = next
	h.noteAside()
	h.mu.Unlock()
	// The lists of endpoints no longer probed go once nothing waits on
	// them: the registry keeps one per endpoint between requests.
	h.waiting.prune(func(addr string) bool { _, ok := seen[addr]; return ok })

	// Requests waiting on an endpoint just found failing are abandoned
	// for a retry, when their service has an endpoint left to retry on
	// (otherwise they would only be sent to another failing one).
	for _, t := range newlyDown {
		left := slices.ContainsFunc(endpoints[t.service], func(a string) bool { _, down := next[a]; return !down })
		if !left {
			continue
		}
		if n := h.waiting.abandon(t.addr, &errAbandoned{addr: t.addr, reason: next[t.addr].Reason}); n > 0 {
			h.logger.Warn("abandoned requests waiting on a failing endpoint, for a retry elsewhere",
				zap.String("instance", t.instance), zap.String("addr", t.addr), zap.Int("requests", n))
		}
	}
}

// probe is one check of t: a GET of its health path answering 2xx or 3xx,
// or a TCP connect when there is no path.
func (h *healthChecker) probe(ctx context.Context, t probeTarget) error {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if t.path == "" {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", t.addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+t.addr+t.path, nil)
	if err != nil {
		return err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no answer within %s", h.timeout)
		}
		return err
	}
	resp.Body.Close()
	if !store.ReadyStatus(resp.StatusCode) {
		return fmt.Errorf("GET %s answered %s", t.path, resp.Status)
	}
	return nil
}

// isDown reports whether dial failed its latest health checks.
func (h *healthChecker) isDown(dial string) bool {
	if !h.anyAside.Load() {
		return false
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	_, down := h.down[dial]
	return down
}

// healthy filters dials (svc's endpoint addresses) to those not set
// aside; when that leaves none, it returns dials whole (fail open) and
// logs it once per episode.
func (h *healthChecker) healthy(svc *projection.Service, dials []string) []string {
	// Every request asks, and nearly always nothing is set aside: one
	// atomic load then, and no lock shared by every core.
	if !h.anyAside.Load() {
		return dials
	}
	h.mu.RLock()
	if len(h.down) == 0 && len(h.failOpen) == 0 {
		h.mu.RUnlock()
		return dials
	}
	out := make([]string, 0, len(dials))
	for _, d := range dials {
		if _, down := h.down[d]; !down {
			out = append(out, d)
		}
	}
	service := svc.Key()
	wasOpen := h.failOpen[service]
	h.mu.RUnlock()
	allDown := len(out) == 0 && len(dials) > 0
	if allDown != wasOpen {
		h.mu.Lock()
		if allDown && !h.failOpen[service] {
			h.failOpen[service] = true
			h.logger.Warn("every endpoint of the service failed its health check; serving them all", zap.String("service", service))
		} else if !allDown {
			delete(h.failOpen, service)
		}
		h.noteAside()
		h.mu.Unlock()
	}
	if allDown {
		return dials
	}
	return out
}

// noteAside keeps anyAside true while something is set aside or served
// failing open; h.mu is held for writing.
func (h *healthChecker) noteAside() {
	h.anyAside.Store(len(h.down) > 0 || len(h.failOpen) > 0)
}

// setAsideOf is what is known against addr, if anything.
func (h *healthChecker) setAsideOf(addr string) (setAside, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	s, ok := h.down[addr]
	return s, ok
}
