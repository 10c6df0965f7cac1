// Package agent is the per-machine side of the control plane: it answers the
// orchestrator's RPCs for one machine (capacity, start candidate, readiness,
// drain, stop, and leased commands guarded by an attempt number) and runs
// instances through a runtime driver. Instances outlive the agent: a
// restarted agent adopts what still runs from the state it persisted, so the
// data plane keeps serving.
//
// The files split the agent by concern: rpc.go dispatches requests,
// instances.go starts, probes, drains and stops instances, heal.go restarts
// those that end on their own, adopt.go persists instance state and adopts
// it at start, leased.go runs leased commands, republish.go keeps the
// routing republishes the control plane has not taken yet, observe.go
// writes the machine's heartbeat and state, unrecorded.go finds the
// instances the store has no record of (it went back in time), logs.go
// serves instance output.
package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// Config configures an agent.
type Config struct {
	Store   *store.Store
	Machine store.MachineRecord
	// DataDir holds instance state (instances/) and logs (logs/).
	DataDir string
	// Driver runs services with a command (the process driver).
	Driver runtime.Driver
	// Containers, if set, runs services with an image through a container
	// engine; without it such a service is refused here.
	Containers *runtime.Container
	Logger     *zap.Logger
	// MaxInstances bounds what the machine accepts; default 256.
	MaxInstances int
	// StopGrace is the default SIGTERM-to-SIGKILL grace; default 10s.
	StopGrace time.Duration
	// RepublishRetry is how often a routing republish the control plane
	// did not take is asked for again; default 2s.
	RepublishRetry time.Duration
	// BeatInterval is how often the agent writes its machine's heartbeat;
	// default store.DefaultBeatInterval.
	BeatInterval time.Duration
	// RestartBackoff is the first wait before an instance that ended on
	// its own is restarted, doubled for each failure in a row up to
	// RestartBackoffMax (with jitter); defaults 1s and 5m. An instance
	// that stayed up for RestartBackoffMax starts over from RestartBackoff.
	RestartBackoff, RestartBackoffMax time.Duration
	// Releases is the release dir the agent upgrades itself in; Self its
	// own binary (the previous one of an upgrade); Trial the upgrade this
	// start belongs to, from upgrade.Dir.Launch (nil: none). Without
	// Releases the agent refuses upgrades.
	Releases upgrade.Dir
	Self     string
	Trial    *upgrade.Trial
	// GatewayReleases and GatewayPidfile name this machine's gateway, run
	// by `caddy supervise --binary GatewayReleases/current --pidfile
	// GatewayPidfile`: an upgrade to a release with a caddy binary swaps
	// it first. Unset, or no gateway running: the gateway is left alone.
	GatewayReleases upgrade.Dir
	GatewayPidfile  string
	// MeshdReleases and MeshdPidfile name this machine's meshd (`meshd
	// run --pidfile`, whose data dir holds MeshdReleases, restarted by its
	// supervisor): an upgrade to a release with a meshd binary restarts
	// it onto the new binary first. Unset, or no meshd running: left
	// alone.
	MeshdReleases upgrade.Dir
	MeshdPidfile  string
	// GatewayUnit and MeshdUnit are the services' systemd units, if they
	// run under systemd: their MainPID is what the agent signals. Without
	// one, a pidfile's PID is signalled only when that process runs the
	// service's binary as the pidfile's owner (service.go).
	GatewayUnit, MeshdUnit string
}

// Agent serves one machine.
//
// Locks, always taken in this order:
//   - an instance's changeMu makes each change of its record (read it,
//     change it, write it to the store and to disk) the only one under
//     way, so no change is lost and the store never ends with an older
//     record than the agent holds (see change); it may be held across
//     calls to the store and the driver;
//   - persistMu serialises writes of instance state files (adopt.go), so a
//     later snapshot is never overwritten by an earlier one;
//   - mu guards instances, attempts, and every field of an instance but its
//     immutable id and Spec (see instance); it is never held across a call
//     to the store, a driver or an instance's probe;
//   - republish.mu (republish.go) and logMu (logs.go) guard what they sit
//     beside, and are taken with nothing else held.
//
// Every section holding a lock is a function of its own that unlocks with
// defer (locked, change, or a method whose body is the section): a panic in
// a request handler, which store.Serve recovers, must not leave one held.
type Agent struct {
	cfg Config
	log *zap.Logger

	persistMu sync.Mutex

	mu        sync.Mutex
	instances map[string]*instance
	// attempts holds the newest leased-command attempt seen per instance
	// (or per service, for a forced cleanup).
	attempts map[string]int

	// republish holds services whose routing republish the control plane
	// has not taken yet; retryRepublish asks again until it does.
	republish *republishQueue

	// quit ends the watchers when Run returns: instances outlive the
	// agent, so their exits are not waited for.
	quit chan struct{}
	wg   sync.WaitGroup
	// restarts counts restarts of instances since the agent started.
	restarts atomic.Uint64

	// stateKick asks observe to write the machine state now.
	stateKick chan struct{}
	// observations writes what the agent sees of its instances, one
	// record for all of them (see note).
	observations *ObservedWriter

	logMu sync.Mutex
	// logSizes samples each instance's output size (see logs.go).
	logSizes map[string][]logSample

	// observed is set once a heartbeat and machine state were written.
	observed atomic.Bool
	// observedOnly is set once the store's floor says every reader reads
	// observations (readers.go); until then instance states are written
	// into the instance records too.
	observedOnly atomic.Bool
	// unrecorded are the instances it runs that the store has no record
	// of (unrecorded.go), reported in the machine state.
	unrecorded atomic.Pointer[[]string]
	// upgradeStatus is the latest upgrade, reported in the machine state.
	upgradeStatus atomic.Pointer[store.UpgradeStatus]
	// upgradeMu makes one upgrade at a time.
	upgradeMu sync.Mutex
	// orders are the nonces of the signed orders taken (set by Run before
	// it serves).
	orders *store.OrderBook
	// cancelRun ends Run; restartInto, when set, is why (guarded by mu).
	cancelRun   context.CancelFunc
	restartInto *RestartError
}

// instance is a running instance and what the agent persists about it.
// Spec and id never change once the instance is known to the agent; every
// other field is read and written holding Agent.mu (record and snapshot
// read it).
type instance struct {
	Runtime runtime.State        `json:"runtime"`
	Record  store.InstanceRecord `json:"record"`
	Spec    store.ServiceSpec    `json:"spec"`
	// Failures counts the times in a row it ended on its own: the
	// exponent of its restart backoff.
	Failures int `json:"failures,omitempty"`

	// changeMu orders the changes of Record (see Agent.change).
	changeMu sync.Mutex
	// id is Record.ID, readable without the lock.
	id string
	// gone is set when the agent forgets the instance (stopped, or failed
	// for good): its state file is not written again.
	gone bool
	// handle is the current run; nil for an instance that did not
	// survive an agent restart and waits for its restart.
	handle   runtime.Handle
	stopping bool
	// readySince is when it last became ready (zero while not).
	readySince time.Time
	// notReady, when set, is why the agent itself ended a restarted
	// instance: the exit its watcher sees is that failure.
	notReady string
	// healCancel ends the scheduled restart, if any (closed by stop).
	healCancel chan struct{}
}

// New checks cfg and returns an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.Store == nil || cfg.Driver == nil || cfg.DataDir == "" || cfg.Machine.ID == "" {
		return nil, errors.New("agent: store, driver, data dir and machine are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.MaxInstances == 0 {
		cfg.MaxInstances = 256
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 10 * time.Second
	}
	if cfg.RepublishRetry == 0 {
		cfg.RepublishRetry = 2 * time.Second
	}
	if cfg.BeatInterval <= 0 {
		cfg.BeatInterval = store.DefaultBeatInterval
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.RestartBackoffMax < cfg.RestartBackoff {
		cfg.RestartBackoffMax = max(5*time.Minute, cfg.RestartBackoff)
	}
	// Instance state and logs are the box's own: no other user reads them
	// (a directory made by an older version is tightened too).
	for _, d := range []string{"", "instances", "logs"} {
		dir := filepath.Join(cfg.DataDir, d)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("agent data dir: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("agent data dir: %w", err)
		}
	}
	log := cfg.Logger.With(zap.String("machine", cfg.Machine.ID))
	a := &Agent{
		cfg: cfg, log: log,
		instances: map[string]*instance{}, attempts: map[string]int{},
		republish: newRepublishQueue(filepath.Join(cfg.DataDir, "republish-pending.json")),
		logSizes:  map[string][]logSample{}, stateKick: make(chan struct{}, 1),
		quit: make(chan struct{}),
	}
	a.observations = NewObservedWriter(cfg.Store, cfg.Machine.ID, a.observedSnapshot)
	if t := cfg.Trial; t != nil {
		a.upgradeStatus.Store(&store.UpgradeStatus{Rollout: t.Rollout, Attempt: t.Attempt, From: t.From, To: t.To, State: t.State, Reason: t.Reason, At: t.At})
		// An upgrade's attempt stays refused as stale after the restart.
		a.attempts["upgrade"] = t.Attempt
	}
	return a, nil
}

// Run adopts persisted instances, then answers RPCs until ctx ends. Instances
// keep running after Run returns.
func (a *Agent) Run(ctx context.Context) error {
	orders, err := store.OpenOrderBook(filepath.Join(a.cfg.DataDir, ordersFile))
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.Machine.ID, err)
	}
	defer orders.Close()
	a.orders = orders
	if err := a.checkFloor(ctx); store.HasCode(err, store.CodeTooOld) {
		return fmt.Errorf("agent %s: %w", a.cfg.Machine.ID, err)
	} else if err != nil {
		a.log.Warn("could not read the store's floor: writing instance states for readers of every generation", zap.Error(err))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.locked(func() { a.cancelRun = cancel })
	if err := a.republish.load(); err != nil {
		a.log.Warn("ignoring unreadable pending republishes", zap.String("file", a.republish.path), zap.Error(err))
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.retryRepublish(ctx)
	}()
	a.adopt(ctx)
	a.wg.Add(3)
	go func() {
		defer a.wg.Done()
		a.sampleLogs()
	}()
	go func() {
		defer a.wg.Done()
		a.watchFloor(ctx)
	}()
	go func() {
		defer a.wg.Done()
		a.observe(ctx)
	}()
	names := a.cfg.Store.Names
	stop, err := store.Serve(ctx, a.cfg.Store.NC, names.NodeListenSubject(a.cfg.Machine.ID),
		names.NodeQueueGroup(a.cfg.Machine.ID), "node."+a.cfg.Machine.ID, a.handle)
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.Machine.ID, err)
	}
	a.log.Info("agent serving", zap.String("subject", names.NodeListenSubject(a.cfg.Machine.ID)), zap.Int("instances", a.count()),
		zap.String("release", version.Version))
	if t := a.cfg.Trial; t != nil && t.State == upgrade.StateTrial {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.gate(ctx, t)
		}()
	}
	<-ctx.Done()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		stop()
		close(a.quit)
		a.wg.Wait()
	}()
	var restart *RestartError
	a.locked(func() { restart = a.restartInto })
	if restart == nil {
		<-finished
		return nil
	}
	// Going on as another binary (this process is replaced): a request
	// that hangs, which may be why the release is rolled back, must not
	// keep it from happening.
	select {
	case <-finished:
	case <-time.After(restartWait):
		a.log.Warn("requests still under way at the restart; restarting anyway", zap.Duration("waited", restartWait))
	}
	return restart
}

// restartWait bounds how long a restart waits for requests under way.
const restartWait = 2 * time.Second

// locked runs f holding mu; a panic in f releases it.
func (a *Agent) locked(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f()
}

func (a *Agent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.instances)
}

// lookup returns the instance the agent runs under id.
func (a *Agent) lookup(id string) (*instance, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	inst, ok := a.instances[id]
	return inst, ok
}

// record is inst's current record.
func (a *Agent) record(inst *instance) store.InstanceRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	return inst.Record
}

// change runs f as the only change of inst's record under way: f reads the
// record, changes it and writes it (writeRecord, setRecord), and no other
// change starts meanwhile. An instance the agent has forgotten (stopped,
// or failed for good) is not changed any more: change returns false
// without running f.
func (a *Agent) change(inst *instance, f func()) bool {
	inst.changeMu.Lock()
	defer inst.changeMu.Unlock()
	gone := false
	a.locked(func() { gone = inst.gone })
	if gone {
		return false
	}
	f()
	return true
}

// setRecord makes rec inst's record, in memory and on disk; the caller is
// inside change.
func (a *Agent) setRecord(inst *instance, rec store.InstanceRecord) {
	a.locked(func() { inst.Record = rec })
	if err := a.persist(inst); err != nil {
		a.log.Error("persisting instance state", zap.String("instance", inst.id), zap.Error(err))
	}
}

// writeRecord stores rec, the instance's durable record: what an apply
// starts and stops, and an instance's end for good. It asks for the
// machine state to be written again.
func (a *Agent) writeRecord(ctx context.Context, rec *store.InstanceRecord) error {
	_, err := a.cfg.Store.PutInstance(ctx, rec)
	a.kickState()
	return err
}

// note makes rec inst's record, in memory and on disk, and returns once
// the machine's observations that say so are in the store: the state
// changes of a running instance (ready, backoff, restarted, draining) are
// written with every other change of the machine's instances made
// meanwhile, one write for all. The caller is inside change. A write that
// fails is written again by observe; the caller hears of it to report it.
func (a *Agent) note(ctx context.Context, inst *instance, rec store.InstanceRecord) error {
	a.setRecord(inst, rec)
	return a.flushObserved(ctx, rec)
}

// flushObserved returns once the machine's observations hold what the
// agent now sees, rec (already inst's record) among it, and rec's record
// too while readers of instance records alone may run (readers.go), and
// asks for the machine state to be written again.
func (a *Agent) flushObserved(ctx context.Context, rec store.InstanceRecord) error {
	_, err := a.observations.Flush(ctx)
	if err == nil {
		err = a.writeForOldReaders(ctx, &rec)
	}
	a.kickState()
	if err != nil {
		return fmt.Errorf("recording instance %s %s: %w", rec.ID, rec.State, err)
	}
	return nil
}

// observedSnapshot is what the agent sees of every instance it runs.
func (a *Agent) observedSnapshot() map[string]store.ObservedInstance {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]store.ObservedInstance, len(a.instances))
	for id, inst := range a.instances {
		out[id] = store.Observe(&inst.Record)
	}
	return out
}

// markFailed records inst, which the agent has forgotten, failed for reason
// and takes it out of the routing.
func (a *Agent) markFailed(ctx context.Context, inst *instance, reason string) {
	rec, err := a.recordFailed(ctx, inst, reason)
	if err != nil {
		a.log.Error("recording instance failure", zap.String("instance", rec.ID), zap.Error(err))
		return
	}
	if err := a.requestRepublish(ctx, rec.Namespace, rec.Service); err != nil {
		a.log.Error("republishing routing after failure", zap.String("instance", rec.ID), zap.Error(err))
	}
}

// recordFailed stores inst's record failed for reason. The instance is
// gone, so change would not run: this is its last change, still ordered
// after any other under way.
func (a *Agent) recordFailed(ctx context.Context, inst *instance, reason string) (store.InstanceRecord, error) {
	inst.changeMu.Lock()
	defer inst.changeMu.Unlock()
	rec := a.record(inst)
	rec.State, rec.Error, rec.UpdatedAt = store.InstanceFailed, reason, time.Now().UTC()
	a.log.Warn("instance failed", zap.String("instance", rec.ID), zap.String("reason", reason))
	return rec, a.writeRecord(ctx, &rec)
}

// ordersFile, in the data dir, keeps the nonces of the orders taken until
// they expire (store.OrderBook).
const ordersFile = "orders-seen"
