package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// LinkState is what a Link reports about its connection.
type LinkState struct {
	// Connected is true while the store answers: a bound store on a live
	// connection.
	Connected bool `json:"connected"`
	// Since is when Connected last changed (or the link started).
	Since time.Time `json:"since"`
	// Attempts counts failed dials since the last time the store answered.
	Attempts int `json:"attempts,omitempty"`
	// LastError is the latest failure, kept until the store answers again.
	LastError string `json:"last_error,omitempty"`
}

// LinkOptions tune a Link.
type LinkOptions struct {
	// Name identifies the connection in server monitoring.
	Name string
	// Backoff is the wait before dial attempt n (1-based) after a failure;
	// default LinkBackoff.
	Backoff func(attempt int) time.Duration
	// OnChange, if set, is told every change of Connected, in order, from
	// the link's own goroutine or NATS's callbacks; it must not block.
	OnChange func(LinkState)
	// Report, if set, is told what went wrong in the background while
	// the link is bound (following the fleet's CA bundle).
	Report func(error)
}

// LinkBackoff waits 1s before the second attempt, doubling up to a minute,
// each wait jittered by ±25% so that a fleet does not dial in lockstep.
func LinkBackoff(attempt int) time.Duration {
	d := time.Second
	for i := 1; i < attempt && d < time.Minute; i++ {
		d *= 2
	}
	d = min(d, time.Minute)
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

// Link is a long-running process's connection to the store, for parts that
// must work without it: it dials in the background, with backoff, until the
// store answers, then keeps that one connection (NATS reconnects it) until
// Close. Store returns the bound store only while it answers, so a reader
// falls back to what it holds locally at once instead of waiting on a store
// that is not there.
type Link struct {
	cfg   Config
	names Names
	opts  LinkOptions

	mu      sync.Mutex
	s       *Store
	state   LinkState
	changed chan struct{}
	// tried is closed once the first dial has an outcome.
	tried     chan struct{}
	triedOnce sync.Once

	cancel context.CancelFunc
	done   chan struct{}
}

// NewLink starts dialing cfg in the background. It fails only for a config
// that names no valid scope: a store that cannot be reached is a state, not
// an error.
func NewLink(cfg Config, opts LinkOptions) (*Link, error) {
	names, err := cfg.Resolve()
	if err != nil {
		return nil, &Error{Code: CodeInvalid, Message: err.Error()}
	}
	if opts.Backoff == nil {
		opts.Backoff = LinkBackoff
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Link{cfg: cfg, names: names, opts: opts, state: LinkState{Since: time.Now()}, changed: make(chan struct{}),
		tried: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go l.run(ctx)
	return l, nil
}

// Bound returns a Link over a store that is already open: for tests and
// callers that dialed themselves. It reports the connection's state as NATS
// sees it.
func Bound(s *Store) *Link {
	l := &Link{s: s, names: s.Names, state: LinkState{Since: time.Now()}, changed: make(chan struct{}),
		tried: make(chan struct{}), done: make(chan struct{})}
	close(l.done)
	close(l.tried)
	l.state.Connected = s.NC.IsConnected()
	return l
}

// run keeps the link bound until ctx ends: it dials, and dials again when
// NATS closes the connection for good (say, its credentials were refused
// on reconnect).
func (l *Link) run(ctx context.Context) {
	defer close(l.done)
	for {
		s, closed := l.dial(ctx)
		if s == nil {
			return
		}
		// While bound, the CA bundle storage nodes are verified against
		// follows the fleet's (a CA rotation reaches every box).
		fctx, stopFollow := context.WithCancel(ctx)
		followed := make(chan struct{})
		go func() {
			defer close(followed)
			l.cfg.Follow(fctx, s, l.opts.Report)
		}()
		select {
		case <-ctx.Done():
			stopFollow()
			<-followed
			return // Close closes the connection
		case <-closed:
		}
		stopFollow()
		<-followed
		l.mu.Lock()
		if l.s == s {
			l.s = nil
		}
		l.mu.Unlock()
		l.set(false, errors.New("NATS closed the connection"))
	}
}

// dial connects until the store answers (returning it and a channel closed
// when NATS closes its connection) or ctx ends (returning nil).
func (l *Link) dial(ctx context.Context) (*Store, <-chan struct{}) {
	for attempt := 1; ; attempt++ {
		closed := make(chan struct{})
		var once sync.Once
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, err := l.cfg.Dial(dctx, ConnectOptions{
			Name: l.opts.Name, ReconnectForever: true, ReconnectDelay: l.opts.Backoff,
			OnDisconnect: func(err error) { l.set(false, err) },
			OnReconnect:  func() { l.set(true, nil) },
			OnClosed:     func() { once.Do(func() { close(closed) }) },
		})
		cancel()
		if err == nil {
			if ctx.Err() != nil {
				s.NC.Close()
				return nil, nil
			}
			l.mu.Lock()
			l.s = s
			l.mu.Unlock()
			l.set(true, nil)
			l.triedOnce.Do(func() { close(l.tried) })
			return s, closed
		}
		l.failed(err)
		l.triedOnce.Do(func() { close(l.tried) })
		t := time.NewTimer(l.opts.Backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-t.C:
		}
	}
}

// failed records a failed dial.
func (l *Link) failed(err error) {
	l.mu.Lock()
	l.state.Attempts++
	l.state.LastError = err.Error()
	first := l.state.Attempts == 1
	st := l.state
	l.mu.Unlock()
	// The first failure is a change too: from "starting" to "unreachable".
	if first && l.opts.OnChange != nil {
		l.opts.OnChange(st)
	}
}

// set records a change of connectedness and wakes Changed's waiters.
func (l *Link) set(connected bool, err error) {
	l.mu.Lock()
	if l.state.Connected == connected {
		l.mu.Unlock()
		return
	}
	l.state.Connected, l.state.Since = connected, time.Now()
	if connected {
		l.state.Attempts, l.state.LastError = 0, ""
	} else if err != nil {
		l.state.LastError = err.Error()
	}
	st := l.state
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	if l.opts.OnChange != nil {
		l.opts.OnChange(st)
	}
}

// Store is the bound store while it answers, else nil.
func (l *Link) Store() *Store {
	l.mu.Lock()
	s := l.s
	l.mu.Unlock()
	if s == nil || !s.NC.IsConnected() {
		return nil
	}
	return s
}

// Names are the names of the store the link binds.
func (l *Link) Names() Names { return l.names }

// Reached reports whether the link has bound a store since it started: a
// link that is not connected now but Reached is reconnecting (NATS is on
// it), one that never Reached has not found the store at all.
func (l *Link) Reached() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s != nil
}

// State reports the link's connection.
func (l *Link) State() LinkState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state
	if l.s != nil {
		st.Connected = l.s.NC.IsConnected()
	}
	return st
}

// Changed is closed at the next change of connectedness.
func (l *Link) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Wait returns the bound store once it answers, or ctx's error.
func (l *Link) Wait(ctx context.Context) (*Store, error) {
	for {
		ch := l.Changed()
		if s := l.Store(); s != nil {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// ReconnectWait is how long Writable waits for a store the link reached
// before, while NATS reconnects to it (a storage node failing over).
const ReconnectWait = 2 * time.Second

// Settle waits, at most ReconnectWait, until the link's first dial has an
// outcome: a part asked for the store right as the process starts should
// not take "not dialed yet" for "unreachable".
func (l *Link) Settle(ctx context.Context) {
	t := time.NewTimer(ReconnectWait)
	defer t.Stop()
	select {
	case <-l.tried:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Writable returns the store for a write of op: at once while it answers,
// after up to ReconnectWait while the first dial runs or NATS reconnects
// to a store the link reached before, and otherwise a store_unavailable
// error (Unavailable): never a wait on a store known to be away.
func (l *Link) Writable(ctx context.Context, op string) (*Store, error) {
	if s := l.Store(); s != nil {
		return s, nil
	}
	l.Settle(ctx)
	if s := l.Store(); s != nil {
		return s, nil
	}
	if l.Reached() {
		wctx, cancel := context.WithTimeout(ctx, ReconnectWait)
		s, err := l.Wait(wctx)
		cancel()
		if err == nil {
			return s, nil
		}
	}
	return nil, l.Unavailable(op)
}

// Unavailable is the store_unavailable error refusing op: the store is
// unreachable, since when, and the last failure.
func (l *Link) Unavailable(op string) *Error {
	st := l.State()
	e := &Error{Code: CodeStoreUnavailable,
		Message: op + ": the store is unreachable; what is held locally keeps being served, and nothing is written until the store answers",
		Detail:  map[string]string{"since": st.Since.UTC().Format(time.RFC3339)}}
	if st.LastError != "" {
		e.Detail["cause"] = st.LastError
	}
	return e
}

// Close stops dialing and closes the connection.
func (l *Link) Close() {
	if l.cancel != nil {
		l.cancel()
	}
	<-l.done
	l.mu.Lock()
	s := l.s
	l.mu.Unlock()
	if s != nil {
		s.NC.Close()
	}
}
