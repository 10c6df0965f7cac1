// Package fleetsim simulates a fleet of machines against a real store:
// each simulated agent answers the real agent RPCs on its machine's
// subject (capacity, start, readiness, stop, inventory), writes real
// instance records, heartbeats and machine state, and runs nothing. The
// control plane cannot tell it from a fleet of agents whose instances
// become ready at once, so benchmarks measure the control plane alone at
// fleet size (see control/deploy's BenchmarkApplyFleet).
package fleetsim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/edgeplane/edgeplane/control/agent"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// Config describes a simulated fleet.
type Config struct {
	// Machines is how many; IDs are Prefix + a five-digit number.
	Machines int
	Prefix   string
	// Capacity is each machine's instance limit; default 256.
	Capacity int
	// Beat is the heartbeat interval; default store.DefaultBeatInterval.
	Beat time.Duration
	// Address is where simulated instances claim to listen.
	Address string
	// Dial, if set, opens the store each simulated agent serves and
	// writes on: its own connection, with its machine's agent credentials
	// (Dialer.Agent). Unset, every agent shares the store Start is given.
	Dial func(ctx context.Context, machine string) (*store.Store, error)
	// Release is the release the simulated agents report running
	// (default "1.0.0"); an upgrade request moves them to another, after
	// verifying the release and fetching its control binary as an agent
	// does, and RestartTime (default 200ms) for the simulated restart.
	Release     string
	RestartTime time.Duration
	// Enrolled says the machines' records (and, with Dial, their
	// credentials) were written beforehand by Enroll: Start only starts
	// the agents, as a fleet's boxes do when they come up.
	Enrolled bool
}

// withDefaults is cfg with the defaults its fields document.
func (cfg Config) withDefaults() Config {
	cfg.Prefix = cmp.Or(cfg.Prefix, "sim")
	cfg.Address = cmp.Or(cfg.Address, "127.0.0.1")
	cfg.Release = cmp.Or(cfg.Release, "1.0.0")
	if cfg.Capacity <= 0 {
		cfg.Capacity = 256
	}
	if cfg.Beat <= 0 {
		cfg.Beat = store.DefaultBeatInterval
	}
	if cfg.RestartTime <= 0 {
		cfg.RestartTime = 200 * time.Millisecond
	}
	return cfg
}

// ids are the machine IDs of cfg's fleet (with its defaults).
func (cfg Config) ids() []string {
	out := make([]string, cfg.Machines)
	for i := range out {
		out[i] = fmt.Sprintf("%s%05d", cfg.Prefix, i)
	}
	return out
}

// Enroll records cfg's machines on s, as admission would, and runs
// prepare (nil: nothing) for each: what precedes an agent's first start
// (Dialer.PrepareAgent issues its credentials).
func Enroll(ctx context.Context, s *store.Store, cfg Config, prepare func(ctx context.Context, machine string) error) error {
	cfg = cfg.withDefaults()
	now := time.Now().UTC()
	ids := cfg.ids()
	err := parallel(ctx, ids, func(ctx context.Context, id string) error {
		rec := store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive, Address: cfg.Address, JoinedAt: now, UpdatedAt: now}
		if err := s.PutMachine(ctx, &rec); err != nil {
			return fmt.Errorf("recording simulated machine %s: %w", id, err)
		}
		if prepare != nil {
			return prepare(ctx, id)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Gateways dial an endpoint only on a machine they know, as
	// admission tells them of each: in one publish, sealed in batches.
	// Without a signer nothing is routed, so none is needed.
	events := make([]store.RoutingEvent, len(ids))
	for i, id := range ids {
		events[i] = store.RoutingEvent{Kind: store.EventMachineUpsert, At: now, Machine: &store.MachineRecord{Version: store.RecordVersion,
			ID: id, State: store.MachineActive, Address: cfg.Address, JoinedAt: now, UpdatedAt: now}}
	}
	if _, err := s.PublishRouting(ctx, "", events); err != nil && !store.HasCode(err, store.CodeSigningKeyRequired) {
		return fmt.Errorf("publishing simulated machines: %w", err)
	}
	return nil
}

// Fleet is a running simulated fleet.
type Fleet struct {
	s   *store.Store
	cfg Config
	IDs []string
	// agents is each machine's store (s itself without Config.Dial);
	// observers write each machine's instance observations through it,
	// coalesced as a real agent's are.
	agents    map[string]*store.Store
	observers map[string]*agent.ObservedWriter

	mu    sync.Mutex
	insts map[string]map[string]store.InstanceRecord // by machine, by instance ID
	// release and upgrade are each machine's running release and latest
	// upgrade (as an agent reports them).
	release map[string]string
	upgrade map[string]*store.UpgradeStatus
	// Fetched counts the release bytes the simulated agents fetched.
	Fetched atomic.Int64
	// placed are the instances Place wrote (machine, instance ID): what
	// Churn changes. Applies' instances are left to the applies.
	placed [][2]string
	// orders are the nonces of the orders the simulated agents took.
	orders *store.OrderBook
	stops  []func()
	wg     sync.WaitGroup
}

// Start records the machines (as admission would, on s) and starts their
// simulated agents until ctx ends or Stop. Without Config.Dial one
// connection carries every agent: the server routes each machine's
// subject to its handler all the same.
func Start(ctx context.Context, s *store.Store, cfg Config) (*Fleet, error) {
	cfg = cfg.withDefaults()
	f := &Fleet{s: s, cfg: cfg, agents: map[string]*store.Store{}, observers: map[string]*agent.ObservedWriter{}, insts: map[string]map[string]store.InstanceRecord{},
		release: map[string]string{}, upgrade: map[string]*store.UpgradeStatus{}}
	f.orders, _ = store.OpenOrderBook("") // in memory: cannot fail
	f.IDs = cfg.ids()
	for _, id := range f.IDs {
		f.insts[id] = map[string]store.InstanceRecord{}
		f.release[id] = cfg.Release
	}
	if !cfg.Enrolled {
		if err := Enroll(ctx, s, cfg, nil); err != nil {
			return nil, err
		}
	}
	runCtx := ctx // the agents' own, beyond starting them
	// A fleet's boxes come up each on its own: many agents start at once,
	// not a few at a time, so that what is measured is the store taking
	// them, not this loop.
	err := parallelN(ctx, f.IDs, startConcurrency, func(ctx context.Context, id string) error {
		as := s
		if cfg.Dial != nil {
			var err error
			if as, err = cfg.Dial(ctx, id); err != nil {
				return err
			}
			f.onStop(as.NC.Close)
		}
		f.mu.Lock()
		f.agents[id] = as
		f.observers[id] = agent.NewObservedWriter(as, id, func() map[string]store.ObservedInstance { return f.observedOf(id) })
		f.mu.Unlock()
		stop, err := store.Serve(runCtx, as.NC, as.Names.NodeListenSubject(id), as.Names.NodeQueueGroup(id), "node."+id,
			func(ctx context.Context, command string, data []byte) (any, error) {
				if store.IsOrder(command) {
					// Checked as a real agent checks it, so the
					// control plane's side is measured with the cost.
					req, _, err := as.VerifyOrder(ctx, id, command, store.RequestHeader(ctx), data, f.orders)
					if err != nil {
						return nil, err
					}
					data = req
				}
				return f.handle(ctx, id, command, data)
			})
		if err != nil {
			return err
		}
		f.onStop(stop)
		return f.writeObservations(ctx, id)
	})
	if err != nil {
		f.Stop()
		return nil, err
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.beat(ctx)
	}()
	return f, nil
}

// beat writes every machine's heartbeat each interval, spread evenly over
// it as a fleet's beats are. Real agents beat each on its own: the beats
// due are written by a pool of workers, so that one slow round trip does
// not hold up every machine's beat behind it (one writer in turn fell
// behind at 10,000 machines, and the fleet read as stale).
func (f *Fleet) beat(ctx context.Context) {
	const workers = 64
	due := make(chan string, len(f.IDs))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(due)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range due {
				_ = f.agent(id).PutMachineBeat(ctx, id, f.cfg.Beat)
			}
		}()
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	start, next := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n := int(float64(now.Sub(start)) / float64(f.cfg.Beat) * float64(len(f.IDs)))
			for ; next < n && ctx.Err() == nil; next++ {
				select {
				case due <- f.IDs[next%len(f.IDs)]:
				default: // a full interval behind: this beat is missed
				}
			}
		}
	}
}

func (f *Fleet) agent(id string) *store.Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents[id]
}

// observedOf is what machine id's simulated agent sees of its instances.
func (f *Fleet) observedOf(id string) map[string]store.ObservedInstance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]store.ObservedInstance, len(f.insts[id]))
	for iid, rec := range f.insts[id] {
		out[iid] = store.Observe(&rec)
	}
	return out
}

// observe writes machine id's instance observations, with whatever else
// changed on it meanwhile, and returns the revision that holds them.
func (f *Fleet) observe(ctx context.Context, id string) (uint64, error) {
	f.mu.Lock()
	w := f.observers[id]
	f.mu.Unlock()
	return w.Flush(ctx)
}

func (f *Fleet) onStop(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, fn)
}

// parallel runs fn for every item, a few at a time, stopping at the first
// error.
func parallel[T any](ctx context.Context, items []T, fn func(context.Context, T) error) error {
	return parallelN(ctx, items, 32, fn)
}

// startConcurrency is how many simulated agents start at once.
const startConcurrency = 512

// parallelN is parallel, n at a time.
func parallelN[T any](ctx context.Context, items []T, n int, fn func(context.Context, T) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(n)
	for _, it := range items {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(ctx, it) })
	}
	return g.Wait()
}

// Stop ends every simulated agent.
func (f *Fleet) Stop() {
	f.mu.Lock()
	stops := f.stops
	f.stops = nil
	f.mu.Unlock()
	for _, stop := range slices.Backward(stops) {
		stop()
	}
}

// Instances counts the simulated instances running now.
func (f *Fleet) Instances() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.insts {
		n += len(m)
	}
	return n
}

func (f *Fleet) writeObservations(ctx context.Context, id string) error {
	as := f.agent(id)
	if err := as.PutMachineBeat(ctx, id, f.cfg.Beat); err != nil {
		return err
	}
	f.mu.Lock()
	n := len(f.insts[id])
	rel, up := f.release[id], f.upgrade[id]
	f.mu.Unlock()
	return as.PutMachineState(ctx, &store.MachineState{Machine: id, Instances: n, Free: max(0, f.cfg.Capacity-n),
		Capacity: f.cfg.Capacity, Drivers: []string{"process"}, ByState: map[string]int{string(store.InstanceReady): n},
		Release: rel, Arch: version.Arch(), Upgrade: up})
}

// Releases counts the simulated machines by the release they run.
func (f *Fleet) Releases() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, r := range f.release {
		out[r]++
	}
	return out
}

// upgradeTo does what an agent's upgrade does to the store: verify the
// release, fetch its control binary (checked against the signed digest),
// answer, and after a simulated restart report the new release confirmed.
func (f *Fleet) upgradeTo(ctx context.Context, id string, req store.UpgradeRequest) (*store.UpgradeReply, error) {
	f.mu.Lock()
	cur := f.release[id]
	f.mu.Unlock()
	rep := &store.UpgradeReply{Attempt: req.Attempt, From: cur, To: req.Release}
	if req.Release == cur {
		rep.Detail = "already running " + cur
		return rep, nil
	}
	as := f.agent(id)
	rel, err := as.Release(ctx, req.Release, version.Arch())
	if err != nil {
		return nil, err
	}
	var n countWriter
	if err := as.FetchReleaseBinary(ctx, rel, "control", &n); err != nil {
		return nil, err
	}
	f.Fetched.Add(int64(n))
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		t := time.NewTimer(f.cfg.RestartTime)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		f.mu.Lock()
		f.release[id] = req.Release
		f.upgrade[id] = &store.UpgradeStatus{Rollout: req.Rollout, Attempt: req.Attempt, From: cur, To: req.Release, State: upgrade.StateConfirmed, At: time.Now().UTC()}
		f.mu.Unlock()
		_ = f.writeObservations(context.WithoutCancel(ctx), id)
	}()
	rep.Restarting = true
	return rep, nil
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

func (f *Fleet) handle(ctx context.Context, id, command string, data []byte) (any, error) {
	switch command {
	case store.CmdCapacity:
		f.mu.Lock()
		n := len(f.insts[id])
		f.mu.Unlock()
		return store.CapacityReply{Machine: id, Address: f.cfg.Address, Driver: "process", Drivers: []string{"process"},
			Instances: n, Free: max(0, f.cfg.Capacity-n)}, nil
	case store.CmdStartCandidate:
		var req store.StartRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "decoding start: %w", err)
		}
		rec := req.Instance
		now := time.Now().UTC()
		rec.Version, rec.Machine, rec.Address, rec.Port = store.RecordVersion, id, f.cfg.Address, 20000+len(rec.ID)
		rec.State, rec.Driver, rec.CreatedAt, rec.UpdatedAt = store.InstanceStarting, "sim", now, now
		if _, err := f.agent(id).PutInstance(ctx, &rec); err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.insts[id][rec.ID] = rec
		f.mu.Unlock()
		if err := f.writeObservations(ctx, id); err != nil {
			return nil, err
		}
		return store.StartReply{Instance: rec}, nil
	case store.CmdReadiness:
		var req store.ReadinessRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "decoding readiness: %w", err)
		}
		f.mu.Lock()
		rec, ok := f.insts[id][req.InstanceID]
		f.mu.Unlock()
		if !ok {
			return nil, store.Errorf(store.CodeNotFound, "instance %s does not run on machine %s", req.InstanceID, id)
		}
		rec.State, rec.UpdatedAt = store.InstanceReady, time.Now().UTC()
		f.mu.Lock()
		f.insts[id][rec.ID] = rec
		f.mu.Unlock()
		if _, err := f.observe(ctx, id); err != nil {
			return nil, err
		}
		return store.ReadinessReply{Ready: true, Instance: rec}, nil
	case store.CmdStopInstance, store.CmdDrainInstance:
		var req store.InstanceRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "decoding stop: %w", err)
		}
		if command == store.CmdDrainInstance {
			return nil, nil
		}
		f.mu.Lock()
		delete(f.insts[id], req.InstanceID)
		f.mu.Unlock()
		if req.Forget {
			_ = f.agent(id).DeleteInstance(ctx, store.InstanceKey(req.Namespace, id, req.InstanceID))
		}
		return nil, f.writeObservations(ctx, id)
	case store.CmdUpgrade:
		var req store.UpgradeRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return nil, store.Errorf(store.CodeInvalid, "decoding upgrade: %w", err)
		}
		return f.upgradeTo(ctx, id, req)
	case store.CmdInventory:
		f.mu.Lock()
		defer f.mu.Unlock()
		out := store.InventoryReply{Machine: id}
		for _, r := range f.insts[id] {
			out.Instances = append(out.Instances, store.InventoryItem{ID: r.ID, Namespace: r.Namespace, Service: r.Service, DeployID: r.DeployID, Running: true})
		}
		return out, nil
	}
	return nil, store.Errorf(store.CodeInvalid, "simulated agent: unknown command %q", command)
}
