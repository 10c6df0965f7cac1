// Package projection keeps the routing projection of one gateway: the
// routable instances of every service and the machines of the cluster, as
// an immutable View that request paths read without locks.
//
// A Projection loads the stored routing state (store.LoadRouting), then
// consumes the ordered routing events stream from the sequence the load saw.
// Whenever it cannot prove that it has seen every event since (a sequence
// gap, a stream recreated or purged past its position, a reconnect to a
// store that went back in time and reuses sequences it applied: rewind.go),
// it rebuilds a fresh View from stored state beside the old one and swaps
// it in, so serving never pauses; the store is the truth, even when it is
// older than what was served. The last good View is persisted to a local
// snapshot and loaded, marked stale, when the gateway starts while NATS is
// unreachable.
//
// The package has no Caddy imports: the gateway's Caddy modules and the DNS
// server both build on it.
package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// Config configures a Projection.
type Config struct {
	// Store is an open store. It may be nil when Connect is set, or
	// unusable at start when NATS is down: the projection keeps retrying.
	Store *store.Store
	// Connect, when Store is nil, opens the store; it is called again after
	// a failure, with backoff. The connection it returns should reconnect
	// on its own (store.ConnectOptions.ReconnectForever).
	Connect func(ctx context.Context) (*store.Store, error)
	// SnapshotPath is where the last good view is persisted and loaded
	// from at start (marked stale). Empty disables the snapshot.
	SnapshotPath string
	// Name is the gateway name for GatewayObservation reports; "" does not
	// report.
	Name string
	// Logger receives state changes; nil logs nothing.
	Logger *zap.Logger

	// ReportInterval is how often the observation is refreshed and the
	// stream head polled; default 2s.
	ReportInterval time.Duration
	// SnapshotInterval is the least time between snapshot writes; default 1s.
	SnapshotInterval time.Duration

	// Traffic, when set (and Name is), reads the gateway's per-service
	// traffic counters, written to the store every TrafficInterval
	// (default DefaultTrafficInterval) as store.GatewayTraffic.
	Traffic         func() (since time.Time, services []store.ServiceTraffic, setAside []store.EndpointSetAside)
	TrafficInterval time.Duration
	// Region, when set, is the gateway's region now, carried in its
	// observation and traffic reports.
	Region func() string
	// Layer4, when set, is what the gateway's observation says of layer
	// 4 as of view v: the instances v does not route to which it still
	// has connections, and the ports it could not open. Report writes
	// the observation again when they change.
	Layer4 func(v *View) ([]store.L4Drain, []store.L4PortError)
}

// DefaultTrafficInterval is how often a gateway reports its traffic unless
// told otherwise.
const DefaultTrafficInterval = 5 * time.Second

// Projection is the routing projection of one process. Create it with New,
// drive it with Run, read it with View.
type Projection struct {
	cfg Config
	log *zap.Logger

	view atomic.Pointer[View]
	// swapMu orders the swaps: one that only flips a flag of the current
	// view (stale, the machines down) must flip it on the view current
	// when it lands, never put back one an event has replaced.
	swapMu sync.Mutex

	chMu    sync.Mutex
	changed chan struct{}

	running atomic.Bool
	cur     atomic.Pointer[store.Store]

	// Counters and gauges for Status; written by the Run goroutines.
	eventsApplied atomic.Uint64
	badEvents     atomic.Uint64
	// dropped counts republished routing events NATS dropped before the
	// session read them (follow.go).
	dropped atomic.Uint64
	// rejected counts events refused for their signature; lastRejection
	// says why the latest was.
	rejected      atomic.Uint64
	lastRejection atomic.Pointer[string]
	// endpointsRefused counts endpoints set aside because their
	// machine's record does not admit them; lastEndpointRefusal says why
	// the latest was.
	endpointsRefused    atomic.Uint64
	lastEndpointRefusal atomic.Pointer[string]
	// skipVerify applies events unverified: tests' unsigned baseline only.
	skipVerify bool
	// installed, when set (tests only, before Run), sees every view
	// swapped in, under swapMu.
	installed func(*View)
	// seal is the verified routing seal that vouches for the events
	// after the applied sequence, if any; the session goroutine's own.
	seal *store.Seal
	// mark is the message the view's sequence stands for, checked after
	// a reconnect to tell a rewound store (rewind.go); the session
	// goroutine's own, as is rewindNoted (a rewind was said for the
	// rebuild under way).
	mark        appliedMark
	rewindNoted bool
	rewinds     atomic.Uint64
	loads       atomic.Uint64
	head        atomic.Uint64
	connected   atomic.Bool
	// downLogged is the reason last logged for the loss of the store, so
	// that an outage is one log line per reason, not one per reconnect
	// attempt; nil while connected.
	downLogged    atomic.Pointer[string]
	lastEventTime atomic.Int64 // publish time of the last applied event (unix ns)
	behindSince   atomic.Int64 // when the head was first seen past applied (unix ns), 0 if not behind
	lastError     atomic.Pointer[string]
	snapshotErr   atomic.Pointer[string]

	reportKick   chan struct{}
	snapshotKick chan struct{}

	// live holds the machines' last beats; downNow is the latest
	// judgement, which every view swapped in carries.
	judged  *store.LivenessRecord // session goroutine's own
	downNow atomic.Pointer[map[string]MachineDown]
}

// New creates a projection. If SnapshotPath holds a snapshot, the
// projection serves it at once, marked stale; an unreadable snapshot is set
// aside (renamed with a ".bad" suffix), reported in Status, and the
// projection starts empty.
func New(cfg Config) (*Projection, error) {
	if cfg.Store == nil && cfg.Connect == nil {
		return nil, errors.New("creating projection: a Store or a Connect function is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = 2 * time.Second
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = time.Second
	}
	if cfg.TrafficInterval <= 0 {
		cfg.TrafficInterval = DefaultTrafficInterval
	}
	p := &Projection{
		cfg: cfg, log: cfg.Logger,
		changed:      make(chan struct{}),
		reportKick:   make(chan struct{}, 1),
		snapshotKick: make(chan struct{}, 1),
	}
	v := emptyView(true)
	if cfg.SnapshotPath != "" {
		sv, err := loadSnapshot(cfg.SnapshotPath)
		switch {
		case err == nil:
			v = sv
			p.log.Info("serving routing snapshot until the store is reachable",
				zap.String("path", cfg.SnapshotPath), zap.Uint64("seq", sv.Seq),
				zap.Time("built_at", sv.BuiltAt), zap.Int("services", sv.numServices))
		case errors.Is(err, os.ErrNotExist):
		default:
			aside := cfg.SnapshotPath + ".bad"
			renameErr := os.Rename(cfg.SnapshotPath, aside)
			msg := fmt.Sprintf("%v (set aside as %s)", err, aside)
			if renameErr != nil {
				msg = fmt.Sprintf("%v (could not set it aside: %v)", err, renameErr)
			}
			p.setError(msg)
			p.log.Error("ignoring unreadable routing snapshot", zap.String("path", cfg.SnapshotPath), zap.String("error", msg))
		}
	}
	p.view.Store(v)
	return p, nil
}

// View returns the current immutable view; never nil.
func (p *Projection) View() *View { return p.view.Load() }

// Changed returns a channel closed when the next View is swapped in.
func (p *Projection) Changed() <-chan struct{} {
	p.chMu.Lock()
	defer p.chMu.Unlock()
	return p.changed
}

// swap installs v and wakes everyone waiting on Changed.
func (p *Projection) swap(v *View) {
	p.swapMu.Lock()
	defer p.swapMu.Unlock()
	p.install(v)
}

// update swaps in what f derives from the view current now.
func (p *Projection) update(f func(cur *View) *View) {
	p.swapMu.Lock()
	defer p.swapMu.Unlock()
	p.install(f(p.View()))
}

// install is swap, under swapMu: v with the machines judged down now.
func (p *Projection) install(v *View) {
	var down map[string]MachineDown
	if d := p.downNow.Load(); d != nil {
		down = *d
	}
	if !sameDown(v.down, down) {
		v = v.withDown(down)
	}
	p.view.Store(v)
	if p.installed != nil {
		p.installed(v)
	}
	p.chMu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.chMu.Unlock()
}

func (p *Projection) setError(msg string) {
	if msg == "" {
		p.lastError.Store(nil)
		return
	}
	p.lastError.Store(&msg)
}

// Status is what the projection reports about itself.
type Status struct {
	Gateway string `json:"gateway,omitempty"`
	// State is "serving" (connected and current), "serving-stale" (the
	// view may be behind: NATS unreachable or not yet loaded), or
	// "starting" (nothing known yet).
	State     string `json:"state"`
	Connected bool   `json:"connected"`
	Stale     bool   `json:"stale"`
	// AppliedSeq is the last routing sequence the view reflects;
	// StreamHead the last the stream was seen to hold.
	AppliedSeq uint64 `json:"applied_seq"`
	StreamHead uint64 `json:"stream_head"`
	LagSeqs    uint64 `json:"lag_seqs"`
	// LagSeconds is how long the view has been behind the head; 0 when
	// current.
	LagSeconds float64 `json:"lag_seconds"`
	// LastEventAgeSeconds is the age of the newest applied event (-1 if
	// none applied since start).
	LastEventAgeSeconds float64 `json:"last_event_age_seconds"`
	EventsApplied       uint64  `json:"events_applied"`
	BadEvents           uint64  `json:"bad_events"`
	// Dropped counts routing events NATS dropped before the projection
	// read them (it reads them again from the stream): 0 unless a burst
	// outgrew what a subscription may hold.
	Dropped uint64 `json:"dropped,omitempty"`
	// Signatures says what routing state must be signed under and how
	// many events were refused for their signature.
	Signatures SignatureStatus `json:"signatures"`
	// Loads counts full loads from the store; Rebuilds those after the
	// first (freshness became uncertain, or NATS came back).
	Loads    uint64 `json:"loads"`
	Rebuilds uint64 `json:"rebuilds"`
	// Rewinds counts the times the store's routing stream was found to
	// have gone back in time (or to be another stream): each rebuilt the
	// view from what the store held then.
	Rewinds  uint64    `json:"rewinds,omitempty"`
	Services int       `json:"services"`
	Routable int       `json:"routable_instances"`
	Machines int       `json:"machines"`
	BuiltAt  time.Time `json:"built_at"`
	// LastError is the latest failure (connect, load, bad event,
	// snapshot), kept until the next success.
	LastError     string `json:"last_error,omitempty"`
	SnapshotError string `json:"snapshot_error,omitempty"`
	// Digest hashes what the view serves (View.Digest).
	Digest string `json:"digest"`
	// Endpoints says which endpoints of signed upserts are not dialled.
	Endpoints EndpointStatus `json:"endpoints"`
	// HostConflicts are hosts routed by more than one namespace; only
	// each one's owner is served (see View.Conflicts).
	HostConflicts []HostConflict `json:"host_conflicts,omitempty"`
	// MachinesDown are the machines whose heartbeats stopped: their
	// instances get no new requests (and no DNS answers) while their
	// services have others.
	MachinesDown map[string]MachineDown `json:"machines_down,omitempty"`
}

// SignatureStatus is the projection's side of signed intent.
type SignatureStatus struct {
	// TrustRoot is the key routing events must be signed under, and
	// TrustSource where it came from (config, credentials, pinned, first
	// use); empty until the store was first reached.
	TrustRoot   string `json:"trust_root,omitempty"`
	TrustSource string `json:"trust_source,omitempty"`
	// Signers the projection knows (certified by the root), and how many
	// of them are retired.
	Signers        int `json:"signers"`
	RetiredSigners int `json:"retired_signers"`
	// Refused counts events not applied because their signature did not
	// verify: their services kept their last good state. LastRefusal says
	// why the latest was refused.
	Refused     uint64 `json:"refused"`
	LastRefusal string `json:"last_refusal,omitempty"`
}

// EndpointStatus is the projection's side of admitted addresses: an
// endpoint is dialled only at its machine's admitted address
// (store.CheckEndpoint), whatever a signed upsert says.
type EndpointStatus struct {
	// SetAside are the endpoints the view does not dial now.
	SetAside int `json:"set_aside"`
	// Refused counts every refusal since start (a rebuild counts those
	// it finds again); LastRefusal says why the latest was.
	Refused     uint64 `json:"refused"`
	LastRefusal string `json:"last_refusal,omitempty"`
}

// Status reports the projection's counters.
func (p *Projection) Status() Status {
	v := p.View()
	now := time.Now()
	st := Status{
		Gateway:       p.cfg.Name,
		Connected:     p.connected.Load(),
		Stale:         v.Stale,
		AppliedSeq:    v.Seq,
		StreamHead:    max(p.head.Load(), v.Seq),
		EventsApplied: p.eventsApplied.Load(),
		BadEvents:     p.badEvents.Load(),
		Dropped:       p.dropped.Load(),
		Loads:         p.loads.Load(),
		Rewinds:       p.rewinds.Load(),
		BuiltAt:       v.BuiltAt,
		MachinesDown:  v.down,
	}
	if st.Loads > 1 {
		st.Rebuilds = st.Loads - 1
	}
	st.Services, st.Routable, st.Machines = v.Counts()
	st.HostConflicts, st.Digest = v.Conflicts(), v.Digest()
	st.LagSeqs = st.StreamHead - st.AppliedSeq
	if bs := p.behindSince.Load(); bs != 0 && st.LagSeqs > 0 {
		st.LagSeconds = now.Sub(time.Unix(0, bs)).Seconds()
	}
	st.LastEventAgeSeconds = -1
	if t := p.lastEventTime.Load(); t != 0 {
		st.LastEventAgeSeconds = now.Sub(time.Unix(0, t)).Seconds()
	}
	switch {
	case st.Loads == 0 && v.Seq == 0 && st.Services == 0 && st.Machines == 0:
		st.State = "starting"
	case st.Stale || !st.Connected:
		st.State = "serving-stale"
	default:
		st.State = "serving"
	}
	if e := p.lastError.Load(); e != nil {
		st.LastError = *e
	}
	if e := p.snapshotErr.Load(); e != nil {
		st.SnapshotError = *e
	}
	st.Endpoints.SetAside, st.Endpoints.Refused = v.SetAside(), p.endpointsRefused.Load()
	if e := p.lastEndpointRefusal.Load(); e != nil {
		st.Endpoints.LastRefusal = *e
	}
	st.Signatures.Refused = p.rejected.Load()
	if e := p.lastRejection.Load(); e != nil {
		st.Signatures.LastRefusal = *e
	}
	if s := p.cur.Load(); s != nil {
		if t, a := s.KnownTrust(); t != nil {
			st.Signatures.TrustRoot, st.Signatures.TrustSource = a.Root, a.Source
			st.Signatures.Signers, st.Signatures.RetiredSigners = t.Signers()
		}
	}
	return st
}

// Run loads the projection, consumes routing events, and rebuilds when
// freshness becomes uncertain, until ctx ends; then it writes a final
// snapshot and returns nil. It returns an error only if called twice at once.
func (p *Projection) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("projection is already running")
	}
	defer p.running.Store(false)

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); p.reportLoop(ctx) }()
	go func() { defer wg.Done(); p.snapshotLoop(ctx) }()
	go func() { defer wg.Done(); p.trafficLoop(ctx) }()
	defer wg.Wait()

	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		st, err := p.openStore(ctx)
		if err != nil {
			p.markDisconnected(err)
			if !backoff.wait(ctx) {
				return nil
			}
			continue
		}
		p.cur.Store(st)
		err = p.session(ctx, st)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errUncertain):
			// Rebuild at once: the old view serves meanwhile.
			if errors.Is(err, errRewound) {
				p.noteRewind(err)
			}
			backoff.reset()
		default:
			// A reconnect the connection's own TLS refused says more
			// than the session's end does.
			p.markDisconnected(cmp.Or(store.TLSFailure(st.NC), err))
			if p.cfg.Store == nil && st.NC.IsClosed() {
				p.cur.Store(nil)
			}
			if !backoff.wait(ctx) {
				return nil
			}
		}
	}
	return nil
}

func (p *Projection) openStore(ctx context.Context) (*store.Store, error) {
	if st := p.cur.Load(); st != nil && !st.NC.IsClosed() {
		return st, nil
	}
	if p.cfg.Store != nil {
		if p.cfg.Store.NC.IsClosed() {
			return nil, errors.New("the store's NATS connection is closed")
		}
		return p.cfg.Store, nil
	}
	return p.cfg.Connect(ctx)
}

func (p *Projection) markDisconnected(err error) {
	if err != nil {
		p.setError(err.Error())
		p.logDown("routing projection cannot reach the store; serving the last good view", err)
	}
	if p.connected.Swap(false) || !p.View().Stale {
		p.update(func(v *View) *View { return v.withStale(true) })
	}
}

// logDown logs the loss of the store once per outage, and again when the
// reason changes (the server went away, then a reconnect was refused).
func (p *Projection) logDown(msg string, err error) {
	why := msg
	if err != nil {
		why = err.Error()
	}
	if last := p.downLogged.Swap(&why); last == nil || *last != why {
		p.log.Warn(msg, zap.Error(err)) // zap.Error(nil) adds nothing
	}
}

// markConnected records that the store answers again.
func (p *Projection) markConnected() {
	p.connected.Store(true)
	p.downLogged.Store(nil)
}

// backoff doubles a wait between failed attempts, up to a maximum.
type backoff struct{ min, max, cur time.Duration }

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max, cur: min} }
func (b *backoff) reset()                        { b.cur = b.min }
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.cur)
	defer t.Stop()
	b.cur = min(b.cur*2, b.max)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
