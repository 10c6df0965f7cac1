// Package agent is the per-machine side of the control plane: it answers the
// orchestrator's RPCs for one machine (capacity, start candidate, readiness,
// drain, stop, and seed-002 leased commands) and runs instances through a
// runtime driver. Instances outlive the agent: a restarted agent adopts what
// still runs from the state it persisted, so the data plane keeps serving.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
	"go.uber.org/zap"
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
}

// Agent serves one machine.
type Agent struct {
	cfg Config
	log *zap.Logger

	mu        sync.Mutex
	instances map[string]*instance
	// attempts holds the newest leased-command attempt seen per instance.
	attempts map[string]int
	// unpublished holds services whose routing republish the control
	// plane has not taken yet; retryRepublish asks again until it does.
	unpublished map[serviceRef]bool
	// quit ends the watchers when Run returns: instances outlive the
	// agent, so their exits are not waited for.
	quit chan struct{}
	wg   sync.WaitGroup
	// restarts counts restarts of instances since the agent started.
	restarts atomic.Uint64

	// stateKick asks observe to write the machine state now.
	stateKick chan struct{}

	// logSizes samples each instance's output size (see logs.go).
	logMu    sync.Mutex
	logSizes map[string][]logSample
}

// instance is a running instance and what the agent persists about it.
type instance struct {
	Runtime runtime.State        `json:"runtime"`
	Record  store.InstanceRecord `json:"record"`
	Spec    store.ServiceSpec    `json:"spec"`
	// Failures counts the times in a row it ended on its own: the
	// exponent of its restart backoff.
	Failures int `json:"failures,omitempty"`

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
	return &Agent{
		cfg: cfg, log: cfg.Logger.With(zap.String("machine", cfg.Machine.ID)),
		instances: map[string]*instance{}, attempts: map[string]int{}, unpublished: map[serviceRef]bool{},
		logSizes: map[string][]logSample{}, stateKick: make(chan struct{}, 1),
		quit: make(chan struct{}),
	}, nil
}

// Run adopts persisted instances, then answers RPCs until ctx ends. Instances
// keep running after Run returns.
func (a *Agent) Run(ctx context.Context) error {
	a.loadUnpublished()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.retryRepublish(ctx)
	}()
	a.adopt(ctx)
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.sampleLogs()
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
	a.log.Info("agent serving", zap.String("subject", names.NodeListenSubject(a.cfg.Machine.ID)), zap.Int("instances", a.count()))
	<-ctx.Done()
	stop()
	close(a.quit)
	a.wg.Wait()
	return nil
}

func (a *Agent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.instances)
}

func (a *Agent) statePath(id string) string {
	return filepath.Join(a.cfg.DataDir, "instances", id+".json")
}

func (a *Agent) persist(inst *instance) error {
	b, err := json.MarshalIndent(inst, "", "  ")
	if err != nil {
		return err
	}
	tmp := a.statePath(inst.Record.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("persisting instance %s: %w", inst.Record.ID, err)
	}
	return os.Rename(tmp, a.statePath(inst.Record.ID))
}

// adopt re-attaches to instances a previous agent started. One that no
// longer runs is recorded as failed, explicitly, and leaves the pool.
func (a *Agent) adopt(ctx context.Context) {
	files, _ := filepath.Glob(filepath.Join(a.cfg.DataDir, "instances", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var inst instance
		if err := json.Unmarshal(b, &inst); err != nil {
			a.log.Warn("ignoring unreadable instance state", zap.String("file", f), zap.Error(err))
			continue
		}
		if inst.Runtime.Driver == "container" && a.cfg.Containers == nil {
			// Not gone, just out of sight: restarting it elsewhere would
			// run it twice. Left as it is until an agent with an engine
			// adopts it.
			a.log.Error("instance runs in a container but this agent has no container engine (--engine); left as it is",
				zap.String("instance", inst.Record.ID), zap.String("container", inst.Runtime.Container))
			continue
		}
		h, err := a.adoptRun(ctx, inst.Runtime)
		if err != nil {
			a.log.Warn("instance did not survive the agent restart", zap.String("instance", inst.Record.ID), zap.Error(err))
			if inst.Spec.RestartPolicy() != store.RestartAlways {
				_ = os.Remove(f)
				a.markFailed(ctx, &inst, "not running after agent restart")
				continue
			}
			// It is restarted as if it had just ended (a backoff already
			// under way keeps its schedule).
			a.mu.Lock()
			a.instances[inst.Record.ID] = &inst
			a.mu.Unlock()
			if inst.Record.State == store.InstanceBackoff && !inst.Record.NextRestart.IsZero() {
				a.scheduleRestart(&inst, time.Until(inst.Record.NextRestart))
			} else {
				a.backoff(&inst, errors.New("not running after agent restart"))
			}
			continue
		}
		inst.handle = h
		if inst.Record.State == store.InstanceReady {
			inst.readySince = time.Now()
		}
		a.mu.Lock()
		a.instances[inst.Record.ID] = &inst
		a.mu.Unlock()
		a.watch(&inst)
		a.log.Info("adopted instance", zap.String("instance", inst.Record.ID), zap.Int("pid", inst.Runtime.PID))
	}
}

// watch handles the end of the instance's current run that the agent did
// not ask for: it leaves the routing at once (republish) and, as its
// restart policy says, is restarted after a backoff or recorded failed.
func (a *Agent) watch(inst *instance) {
	a.mu.Lock()
	h := inst.handle
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-h.Exited():
		case <-a.quit:
			return
		}
		a.mu.Lock()
		stopping, current := inst.stopping, a.instances[inst.Record.ID] == inst && inst.handle == h
		why := h.ExitErr()
		if inst.notReady != "" {
			why, inst.notReady = errors.New(inst.notReady), ""
		}
		restart := current && !stopping && wantsRestart(inst.Spec.RestartPolicy(), why)
		if !stopping && !restart && current {
			delete(a.instances, inst.Record.ID)
		}
		a.mu.Unlock()
		if stopping || !current {
			return
		}
		if restart {
			a.backoff(inst, why)
			return
		}
		_ = os.Remove(a.statePath(inst.Record.ID))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.markFailed(ctx, inst, why.Error())
	}()
}

func (a *Agent) markFailed(ctx context.Context, inst *instance, reason string) {
	rec := inst.Record
	rec.State, rec.Error, rec.UpdatedAt = store.InstanceFailed, reason, time.Now().UTC()
	a.log.Warn("instance failed", zap.String("instance", rec.ID), zap.String("reason", reason))
	if err := a.writeRecord(ctx, &rec); err != nil {
		a.log.Error("recording instance failure", zap.String("instance", rec.ID), zap.Error(err))
		return
	}
	if err := a.republish(ctx, rec.Namespace, rec.Service); err != nil {
		a.log.Error("republishing routing after failure", zap.String("instance", rec.ID), zap.Error(err))
	}
}

// serviceRef names one service of one namespace.
type serviceRef struct{ namespace, service string }

// republish asks the control plane to publish the service's routing again
// from stored state, so gateways see an instance's new status at once. A
// request the control plane did not take is remembered and asked again by
// retryRepublish: a gateway would otherwise keep routing to an instance
// that left until its next rebuild. A namespace without a committed deploy,
// or a service this machine runs nothing of, has nothing to republish.
func (a *Agent) republish(ctx context.Context, ns, service string) error {
	ref := serviceRef{ns, service}
	_, err := a.cfg.Store.RequestRepublish(ctx, a.cfg.Machine.ID, ns, service)
	a.mu.Lock()
	defer a.mu.Unlock()
	was := a.unpublished[ref]
	switch {
	case err == nil || store.HasCode(err, store.CodeNotFound):
		delete(a.unpublished, ref)
		err = nil
	case store.HasCode(err, store.CodeRPCFailure), store.HasCode(err, store.CodeUnavailable),
		store.HasCode(err, store.CodeQuorumUnavailable), store.HasCode(err, store.CodeInternal):
		// The control plane or its store is away: worth asking again.
		a.unpublished[ref] = true
	default:
		// A refusal (invalid, say) stays one; asking again changes nothing.
		delete(a.unpublished, ref)
	}
	if a.unpublished[ref] != was {
		if perr := a.persistUnpublished(); perr != nil {
			a.log.Error("persisting pending routing republishes", zap.Error(perr))
		}
	}
	if err != nil {
		return fmt.Errorf("republishing %s/%s: %w", ns, service, err)
	}
	return nil
}

// pendingRepublish is the agent data dir's record of republishes the
// control plane has not taken, so an agent restarted meanwhile still asks.
type pendingRepublish struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
}

func (a *Agent) unpublishedPath() string {
	return filepath.Join(a.cfg.DataDir, "republish-pending.json")
}

// persistUnpublished writes the pending set; a.mu is held.
func (a *Agent) persistUnpublished() error {
	if len(a.unpublished) == 0 {
		if err := os.Remove(a.unpublishedPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	list := make([]pendingRepublish, 0, len(a.unpublished))
	for ref := range a.unpublished {
		list = append(list, pendingRepublish{ref.namespace, ref.service})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	tmp := a.unpublishedPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, a.unpublishedPath())
}

// loadUnpublished reads what a previous agent had not got republished.
func (a *Agent) loadUnpublished() {
	b, err := os.ReadFile(a.unpublishedPath())
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var list []pendingRepublish
	if err == nil {
		err = json.Unmarshal(b, &list)
	}
	if err != nil {
		a.log.Warn("ignoring unreadable pending republishes", zap.String("file", a.unpublishedPath()), zap.Error(err))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range list {
		a.unpublished[serviceRef{p.Namespace, p.Service}] = true
	}
}

// retryRepublish asks again for every republish the control plane has not
// taken, each RepublishRetry, until ctx ends.
func (a *Agent) retryRepublish(ctx context.Context) {
	t := time.NewTicker(a.cfg.RepublishRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		refs := make([]serviceRef, 0, len(a.unpublished))
		for ref := range a.unpublished {
			refs = append(refs, ref)
		}
		a.mu.Unlock()
		for _, ref := range refs {
			if err := a.republish(ctx, ref.namespace, ref.service); err != nil {
				a.log.Warn("routing republish still not taken", zap.String("namespace", ref.namespace), zap.String("service", ref.service), zap.Error(err))
			} else {
				a.log.Info("routing republished after retry", zap.String("namespace", ref.namespace), zap.String("service", ref.service))
			}
		}
	}
}

func (a *Agent) writeRecord(ctx context.Context, rec *store.InstanceRecord) error {
	rec.Version = store.RecordVersion
	_, err := store.PutJSON(ctx, a.cfg.Store.Instances, rec.Key(), rec)
	a.kickState()
	return err
}

func (a *Agent) handle(ctx context.Context, command string, data []byte) (any, error) {
	switch command {
	case store.CmdCapacity:
		return a.capacity(), nil
	case store.CmdInventory:
		return a.inventory(ctx), nil
	case store.CmdResolveImage:
		var req store.ResolveImageRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.resolveImage(ctx, req)
	case store.CmdLogs:
		var req store.LogsRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.readLogs(ctx, req)
	case store.CmdStartCandidate:
		var req store.StartRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.start(ctx, req)
	case store.CmdReadiness:
		var req store.ReadinessRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.readiness(ctx, req)
	case store.CmdDrainInstance:
		var req store.InstanceRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return nil, a.drain(ctx, req.InstanceID)
	case store.CmdStopInstance:
		var req store.InstanceRequest
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return nil, a.stop(ctx, req)
	case store.CmdRestart, store.CmdStop, store.CmdForceCleanup:
		var req store.LeasedCommand
		if err := decode(command, data, &req); err != nil {
			return nil, err
		}
		return a.leased(ctx, command, req)
	}
	return nil, store.Errorf(store.CodeInvalid, "unknown command %q", command).With("command", command)
}

func decode(command string, data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return store.Errorf(store.CodeInvalid, "decoding %s request: %w", command, err)
	}
	return nil
}

func (a *Agent) capacity() store.CapacityReply {
	n := a.count()
	m := a.cfg.Machine
	return store.CapacityReply{
		Machine: m.ID, Region: m.Region, Labels: m.Labels, Address: m.Address,
		Driver: a.cfg.Driver.Name(), Drivers: a.drivers(), Instances: n, Free: max(0, a.cfg.MaxInstances-n),
	}
}

// inventory lists what the agent runs, and containers with edgeplane's
// labels that it does not know (strays).
func (a *Agent) inventory(ctx context.Context) store.InventoryReply {
	out := store.InventoryReply{Machine: a.cfg.Machine.ID}
	known := map[string]bool{}
	func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		out.Instances = make([]store.InventoryItem, 0, len(a.instances))
		for _, inst := range a.instances {
			r := inst.Record
			known[r.ID] = true
			out.Instances = append(out.Instances, store.InventoryItem{ID: r.ID, Namespace: r.Namespace, Service: r.Service,
				DeployID: r.DeployID, Running: running(inst.handle)})
		}
	}()
	if a.cfg.Containers != nil {
		list, err := a.cfg.Containers.List(ctx)
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
		}
		for _, c := range list {
			if !known[c.Instance] && c.Running {
				out.Instances = append(out.Instances, store.InventoryItem{ID: c.Instance, Namespace: c.Labels[runtime.LabelNamespace],
					Service: c.Labels[runtime.LabelService], Running: true, Container: c.Container, Unknown: true})
			}
		}
	}
	sort.Slice(out.Instances, func(i, j int) bool { return out.Instances[i].ID < out.Instances[j].ID })
	return out
}

// resolveImage answers CmdResolveImage from the engine's image store
// (pulling what it lacks).
func (a *Agent) resolveImage(ctx context.Context, req store.ResolveImageRequest) (*store.ResolveImageReply, error) {
	if a.cfg.Containers == nil {
		return nil, store.Errorf(store.CodeUnavailable, "machine %s has no container engine", a.cfg.Machine.ID).With("machine", a.cfg.Machine.ID)
	}
	img, err := a.cfg.Containers.ResolveImage(ctx, req.Image)
	if errors.Is(err, runtime.ErrNoImage) {
		return nil, store.Errorf(store.CodeNotFound, "image %s is not on machine %s and could not be pulled", req.Image, a.cfg.Machine.ID).
			With("image", req.Image).With("machine", a.cfg.Machine.ID)
	}
	if err != nil {
		return nil, store.Errorf(store.CodeUnavailable, "%w", err).With("machine", a.cfg.Machine.ID)
	}
	return &store.ResolveImageReply{ID: img.ID, RepoTags: img.RepoTags, RepoDigests: img.RepoDigests}, nil
}

func (a *Agent) start(ctx context.Context, req store.StartRequest) (*store.StartReply, error) {
	rec := req.Instance
	if rec.ID == "" || rec.Namespace == "" || rec.Service == "" {
		return nil, store.Errorf(store.CodeInvalid, "start: instance id, namespace and service are required")
	}
	a.mu.Lock()
	if inst, ok := a.instances[rec.ID]; ok {
		// A retried start of the same candidate is answered, not repeated.
		a.mu.Unlock()
		return &store.StartReply{Instance: inst.Record}, nil
	}
	if len(a.instances) >= a.cfg.MaxInstances {
		a.mu.Unlock()
		return nil, store.Errorf(store.CodeUnavailable, "machine %s is full (%d instances)", a.cfg.Machine.ID, a.cfg.MaxInstances)
	}
	a.mu.Unlock()

	port := req.Spec.Port
	if port == 0 {
		p, err := freePort(a.cfg.Machine.Address)
		if err != nil {
			return nil, store.Errorf(store.CodeUnavailable, "start %s: choosing a port: %w", rec.ID, err)
		}
		port = p
	}
	h, err := a.launch(ctx, rec, req.Spec, port)
	if err != nil {
		// A refusal keeps its code (no engine is unavailable, not
		// internal); anything else is internal.
		return nil, store.AsError(err).With("instance", rec.ID)
	}
	now := time.Now().UTC()
	rec.Machine, rec.Address, rec.Port = a.cfg.Machine.ID, a.cfg.Machine.Address, port
	rec.State, rec.Error, rec.Driver, rec.PID, rec.Container = store.InstanceStarting, "", h.State().Driver, h.State().PID, h.State().Container
	rec.CreatedAt, rec.UpdatedAt = now, now
	inst := &instance{Runtime: h.State(), Record: rec, Spec: req.Spec, handle: h}
	if err := a.persist(inst); err != nil {
		_ = a.driverOf(h).Stop(ctx, h, time.Second)
		return nil, err
	}
	a.mu.Lock()
	a.instances[rec.ID] = inst
	a.mu.Unlock()
	// The record says starting before anything can say it ended: an
	// instance that dies at once is then recorded so, not overwritten.
	err = a.writeRecord(ctx, &rec)
	if err == nil {
		a.setRecord(inst, rec)
	}
	a.watch(inst)
	if err != nil {
		return nil, err
	}
	a.log.Info("started instance", zap.String("instance", rec.ID), zap.Int("pid", rec.PID), zap.Int("port", port))
	return &store.StartReply{Instance: rec}, nil
}

// launch starts rec's process (or container) through the driver on port.
func (a *Agent) launch(ctx context.Context, rec store.InstanceRecord, spec store.ServiceSpec, port int) (runtime.Handle, error) {
	env := map[string]string{}
	for k, v := range spec.Env {
		env[k] = v
	}
	env["EDGEPLANE_SERVICE"] = rec.Service
	env["EDGEPLANE_NAMESPACE"] = rec.Namespace
	env["EDGEPLANE_SLOT"] = strconv.Itoa(rec.Slot)
	env["EDGEPLANE_REVISION"] = strconv.FormatInt(rec.Revision, 10)
	env["EDGEPLANE_MACHINE"] = a.cfg.Machine.ID
	rs := runtime.Spec{
		ID: rec.ID, Command: spec.Command, Env: env,
		Host: a.cfg.Machine.Address, Port: port, LogDir: filepath.Join(a.cfg.DataDir, "logs"),
	}
	if spec.Image == "" {
		return a.cfg.Driver.Start(ctx, rs)
	}
	if a.cfg.Containers == nil {
		return nil, store.Errorf(store.CodeUnavailable, "machine %s has no container engine for image %s", a.cfg.Machine.ID, spec.Image).
			With("machine", a.cfg.Machine.ID).With("image", spec.Image)
	}
	// What the deploy pinned, never the tag (a start before any deploy
	// pinned it resolves the tag now).
	rs.Image = spec.ImageID
	if rs.Image == "" {
		img, err := a.cfg.Containers.ResolveImage(ctx, spec.Image)
		if err != nil {
			return nil, err
		}
		rs.Image = img.ID
	}
	rs.ReadOnlyRoot, rs.CPUs = spec.ReadOnly, spec.Resources.CPUs
	if spec.Resources.Memory != "" {
		n, err := manifest.MemoryBytes(spec.Resources.Memory)
		if err != nil {
			return nil, store.Errorf(store.CodeInvalid, "%w", err)
		}
		rs.Memory = n
	}
	rs.Labels = map[string]string{
		runtime.LabelNamespace: rec.Namespace, runtime.LabelService: rec.Service, runtime.LabelSlot: strconv.Itoa(rec.Slot),
		runtime.LabelRevision: strconv.FormatInt(rec.Revision, 10), runtime.LabelMachine: a.cfg.Machine.ID,
	}
	return a.cfg.Containers.Start(ctx, rs)
}

// drivers names what this machine can run.
func (a *Agent) drivers() []string {
	out := []string{a.cfg.Driver.Name()}
	if a.cfg.Containers != nil {
		out = append(out, a.cfg.Containers.Name())
	}
	return out
}

// driverOf is the driver that runs h.
func (a *Agent) driverOf(h runtime.Handle) runtime.Driver {
	if a.cfg.Containers != nil && h != nil && h.State().Driver == a.cfg.Containers.Name() {
		return a.cfg.Containers
	}
	return a.cfg.Driver
}

// adoptRun re-attaches to a run a previous agent started, with the driver
// that started it.
func (a *Agent) adoptRun(ctx context.Context, st runtime.State) (runtime.Handle, error) {
	if st.Driver == "container" {
		if a.cfg.Containers == nil {
			return nil, fmt.Errorf("adopting %s: this agent has no container engine: %w", st.ID, runtime.ErrGone)
		}
		return a.cfg.Containers.Adopt(ctx, st)
	}
	return a.cfg.Driver.Adopt(ctx, st)
}

func (a *Agent) setRecord(inst *instance, rec store.InstanceRecord) {
	a.mu.Lock()
	inst.Record = rec
	a.mu.Unlock()
	_ = a.persist(inst)
}

// running says whether h's run is still going; a nil handle (an instance
// that did not survive an agent restart, waiting for its own) is not.
func running(h runtime.Handle) bool {
	if h == nil {
		return false
	}
	select {
	case <-h.Exited():
		return false
	default:
		return true
	}
}

func (a *Agent) lookup(id string) (*instance, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	inst, ok := a.instances[id]
	return inst, ok
}

func (a *Agent) readiness(ctx context.Context, req store.ReadinessRequest) (*store.ReadinessReply, error) {
	inst, ok := a.lookup(req.InstanceID)
	if !ok {
		return nil, store.Errorf(store.CodeNotFound, "instance %s does not run on machine %s", req.InstanceID, a.cfg.Machine.ID)
	}
	return a.awaitReady(ctx, inst, time.Duration(req.Timeout))
}

// awaitReady probes inst until it is ready (recorded so), its run ends, or
// timeout (default: its spec's) passes.
func (a *Agent) awaitReady(ctx context.Context, inst *instance, timeout time.Duration) (*store.ReadinessReply, error) {
	if timeout <= 0 {
		timeout = manifest.ReadinessTimeout(inst.Spec)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a.mu.Lock()
	rec, h := inst.Record, inst.handle
	a.mu.Unlock()
	if h == nil {
		return &store.ReadinessReply{Ready: false, Error: "instance is not running (it waits for its restart)", Instance: rec}, nil
	}
	probe := readinessProbe(rec.Address, rec.Port, inst.Spec.Readiness.Path)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var lastErr error
	for {
		if lastErr = probe(ctx); lastErr == nil {
			break
		}
		select {
		case <-h.Exited():
			return &store.ReadinessReply{Ready: false, Error: "instance " + h.ExitErr().Error(), Instance: rec}, nil
		case <-ctx.Done():
			return &store.ReadinessReply{Ready: false, Error: fmt.Sprintf("not ready after %s: %v", timeout, lastErr), Instance: rec}, nil
		case <-t.C:
		}
	}
	a.mu.Lock()
	rec = inst.Record
	inst.readySince = time.Now()
	a.mu.Unlock()
	rec.State, rec.Error, rec.UpdatedAt = store.InstanceReady, "", time.Now().UTC()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := a.writeRecord(wctx, &rec); err != nil {
		return nil, err
	}
	a.setRecord(inst, rec)
	return &store.ReadinessReply{Ready: true, Instance: rec}, nil
}

func readinessProbe(host string, port int, path string) func(context.Context) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	if path == "" {
		return func(ctx context.Context) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			return c.Close()
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	url := "http://" + addr + path
	return func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return nil
	}
}

// drain marks the instance draining, which makes it unroutable, and
// republishes its service so gateways drop it now.
func (a *Agent) drain(ctx context.Context, id string) error {
	inst, ok := a.lookup(id)
	if !ok {
		return store.Errorf(store.CodeNotFound, "instance %s does not run on machine %s", id, a.cfg.Machine.ID)
	}
	rec := inst.Record
	rec.State, rec.UpdatedAt = store.InstanceDraining, time.Now().UTC()
	if err := a.writeRecord(ctx, &rec); err != nil {
		return err
	}
	a.setRecord(inst, rec)
	if err := a.republish(ctx, rec.Namespace, rec.Service); err != nil {
		return err
	}
	return nil
}

func (a *Agent) stop(ctx context.Context, req store.InstanceRequest) error {
	grace := time.Duration(req.Grace)
	if grace <= 0 {
		grace = a.cfg.StopGrace
	}
	inst, ok := a.lookup(req.InstanceID)
	if ok {
		a.mu.Lock()
		if inst.healCancel != nil {
			close(inst.healCancel)
			inst.healCancel = nil
		}
		inst.stopping = true
		h := inst.handle
		a.mu.Unlock()
		// No handle: it did not survive an agent restart and waits for
		// its own; nothing runs to stop.
		if h != nil {
			if err := a.driverOf(h).Stop(ctx, h, grace); err != nil {
				a.mu.Lock()
				inst.stopping = false
				a.mu.Unlock()
				return store.Errorf(store.CodeInternal, "%w", err).With("instance", req.InstanceID)
			}
		}
		a.mu.Lock()
		delete(a.instances, req.InstanceID)
		a.mu.Unlock()
		_ = os.Remove(a.statePath(req.InstanceID))
		a.log.Info("stopped instance", zap.String("instance", req.InstanceID))
	}
	a.kickState()
	// Stopping what is already gone succeeds: the caller wants it not running.
	// The orchestrator asks the machine an instance runs on, so the record
	// is under this machine's key (the only ones its credentials may write).
	key := store.InstanceKey(req.Namespace, a.cfg.Machine.ID, req.InstanceID)
	if req.Forget {
		if err := a.cfg.Store.Instances.Delete(ctx, key); err != nil {
			return store.Classify(fmt.Errorf("forgetting instance %s: %w", req.InstanceID, err))
		}
		return nil
	}
	var rec store.InstanceRecord
	if _, err := store.GetJSON(ctx, a.cfg.Store.Instances, key, &rec); err == nil {
		rec.State, rec.UpdatedAt = store.InstanceStopped, time.Now().UTC()
		return a.writeRecord(ctx, &rec)
	}
	return nil
}

// leased runs a seed-002 leased command. The attempt number guards the
// generation: an attempt older than the newest seen is refused as stale.
func (a *Agent) leased(ctx context.Context, command string, req store.LeasedCommand) (*store.LeasedReply, error) {
	guard := req.InstanceID
	if command == store.CmdForceCleanup {
		guard = "service:" + req.Namespace + "/" + req.Service
	}
	a.mu.Lock()
	if last := a.attempts[guard]; req.Attempt < last {
		a.mu.Unlock()
		return nil, store.Errorf(store.CodeStale, "attempt %d of %s is older than attempt %d", req.Attempt, command, last).
			With("attempt", strconv.Itoa(req.Attempt)).With("newest", strconv.Itoa(last))
	}
	a.attempts[guard] = req.Attempt
	a.mu.Unlock()

	reply := &store.LeasedReply{Attempt: req.Attempt}
	switch command {
	case store.CmdStop:
		if err := a.stop(ctx, store.InstanceRequest{InstanceID: req.InstanceID, Namespace: req.Namespace, Grace: req.Grace}); err != nil {
			return nil, err
		}
		if err := a.republish(ctx, req.Namespace, req.Service); err != nil {
			return nil, err
		}
		reply.Detail = "stopped"
	case store.CmdRestart:
		inst, ok := a.lookup(req.InstanceID)
		if !ok {
			return nil, store.Errorf(store.CodeNotFound, "instance %s does not run on machine %s", req.InstanceID, a.cfg.Machine.ID)
		}
		rec, spec := inst.Record, inst.Spec
		if err := a.drain(ctx, rec.ID); err != nil {
			return nil, err
		}
		if err := a.stop(ctx, store.InstanceRequest{InstanceID: rec.ID, Namespace: rec.Namespace, Grace: req.Grace}); err != nil {
			return nil, err
		}
		spec.Port = rec.Port // keep the address the commit routes to
		if _, err := a.start(ctx, store.StartRequest{Instance: rec, Spec: spec}); err != nil {
			return nil, err
		}
		rr, err := a.readiness(ctx, store.ReadinessRequest{InstanceID: rec.ID, Namespace: rec.Namespace})
		if err != nil {
			return nil, err
		}
		if !rr.Ready {
			return nil, store.Errorf(store.CodeUnavailable, "restarted instance %s is not ready: %s", rec.ID, rr.Error)
		}
		if err := a.republish(ctx, rec.Namespace, rec.Service); err != nil {
			return nil, err
		}
		reply.Detail = "restarted"
	case store.CmdForceCleanup:
		var ids []string
		a.mu.Lock()
		for id, inst := range a.instances {
			if inst.Record.Namespace == req.Namespace && inst.Record.Service == req.Service {
				ids = append(ids, id)
			}
		}
		a.mu.Unlock()
		for _, id := range ids {
			if err := a.stop(ctx, store.InstanceRequest{InstanceID: id, Namespace: req.Namespace, Grace: req.Grace, Forget: true}); err != nil {
				return nil, err
			}
		}
		reply.Detail = fmt.Sprintf("removed %d instances", len(ids))
	}
	reply.Done, reply.Finished = true, time.Now().UTC()
	return reply, nil
}

// Instance ports are chosen at random below Linux's ephemeral range
// (32768-60999): the kernel's own choice for a port-0 listener tends to
// hand the port just released to the next asker, so two agents on one
// host (or two quick starts) picked the same one; outgoing connections
// never take ports below the range either.
const (
	instancePortMin = 20000
	instancePortMax = 32767
)

func freePort(host string) (int, error) {
	for range 64 {
		p := instancePortMin + rand.IntN(instancePortMax-instancePortMin+1)
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			continue // taken
		}
		l.Close()
		return p, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
