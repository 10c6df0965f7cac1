package agent

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
)

// start answers CmdStartCandidate: it runs a new instance and records it
// starting. A retried start of an instance the agent already runs is
// answered with its record, not repeated.
func (a *Agent) start(ctx context.Context, req store.StartRequest) (*store.StartReply, error) {
	rec := req.Instance
	if rec.ID == "" || rec.Namespace == "" || rec.Service == "" {
		return nil, store.Errorf(store.CodeInvalid, "start: instance id, namespace and service are required")
	}
	if known, full := a.admit(rec.ID); known != nil {
		return &store.StartReply{Instance: *known}, nil
	} else if full {
		return nil, store.Errorf(store.CodeUnavailable, "machine %s is full (%d instances)", a.cfg.Machine.ID, a.cfg.MaxInstances)
	}

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
	inst := &instance{Runtime: h.State(), Record: rec, Spec: req.Spec, id: rec.ID, handle: h}
	if err := a.persist(inst); err != nil {
		_ = a.driverOf(h).Stop(ctx, h, time.Second)
		return nil, err
	}
	a.locked(func() { a.instances[rec.ID] = inst })
	// The record says starting before anything can say it ended: an
	// instance that dies at once is then recorded so, not overwritten.
	a.change(inst, func() {
		if err = a.writeRecord(ctx, &rec); err == nil {
			a.setRecord(inst, rec)
		}
	})
	a.watch(inst)
	if err != nil {
		return nil, err
	}
	a.log.Info("started instance", zap.String("instance", rec.ID), zap.Int("pid", rec.PID), zap.Int("port", port))
	return &store.StartReply{Instance: rec}, nil
}

// admit says whether a new instance id may start: known is the record of
// an instance the agent already runs under id, full that the machine runs
// as many as it takes.
func (a *Agent) admit(id string) (known *store.InstanceRecord, full bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst, ok := a.instances[id]; ok {
		rec := inst.Record
		return &rec, false
	}
	return nil, len(a.instances) >= a.cfg.MaxInstances
}

// launch starts rec's process (or container) through the driver on port.
func (a *Agent) launch(ctx context.Context, rec store.InstanceRecord, spec store.ServiceSpec, port int) (runtime.Handle, error) {
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
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

// readiness answers CmdReadiness.
func (a *Agent) readiness(ctx context.Context, req store.ReadinessRequest) (*store.ReadinessReply, error) {
	inst, ok := a.lookup(req.InstanceID)
	if !ok {
		return nil, a.notHere(req.InstanceID)
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
	var rec store.InstanceRecord
	var h runtime.Handle
	a.locked(func() { rec, h = inst.Record, inst.handle })
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
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	var err error
	changed := a.change(inst, func() {
		a.locked(func() {
			rec = inst.Record
			inst.readySince = time.Now()
		})
		rec.State, rec.Error, rec.UpdatedAt = store.InstanceReady, "", time.Now().UTC()
		err = a.note(wctx, inst, rec)
	})
	switch {
	case !changed:
		return &store.ReadinessReply{Ready: false, Error: "instance was stopped", Instance: rec}, nil
	case err != nil:
		return nil, err
	}
	return &store.ReadinessReply{Ready: true, Instance: rec}, nil
}

// readinessProbe checks host:port once: an HTTP GET of path that must
// answer 2xx, or without a path a TCP connect.
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
		if !store.ReadyStatus(resp.StatusCode) {
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
		return a.notHere(id)
	}
	var rec store.InstanceRecord
	var err error
	if !a.change(inst, func() {
		rec = a.record(inst)
		rec.State, rec.UpdatedAt = store.InstanceDraining, time.Now().UTC()
		err = a.note(ctx, inst, rec)
	}) {
		return a.notHere(id)
	}
	if err != nil {
		return err
	}
	return a.requestRepublish(ctx, rec.Namespace, rec.Service)
}

// stop answers CmdStopInstance: the instance's run is stopped (SIGTERM,
// then SIGKILL after the grace), the agent forgets it, and its record says
// stopped, or is deleted with req.Forget. Stopping what is already gone
// succeeds: the caller wants it not running.
func (a *Agent) stop(ctx context.Context, req store.InstanceRequest) error {
	grace := time.Duration(req.Grace)
	if grace <= 0 {
		grace = a.cfg.StopGrace
	}
	var last *store.InstanceRecord
	if inst, ok := a.lookup(req.InstanceID); ok {
		// The stop is the instance's last change: none starts before its
		// record says stopped, and none after (it is gone by then).
		inst.changeMu.Lock()
		defer inst.changeMu.Unlock()
		// No handle: it did not survive an agent restart and waits for
		// its own; nothing runs to stop.
		if h := a.beginStop(inst); h != nil {
			if err := a.driverOf(h).Stop(ctx, h, grace); err != nil {
				a.locked(func() { inst.stopping = false })
				return store.Errorf(store.CodeInternal, "%w", err).With("instance", req.InstanceID)
			}
		}
		a.locked(func() {
			inst.gone = true
			if a.instances[req.InstanceID] == inst {
				delete(a.instances, req.InstanceID)
			}
		})
		a.forget(req.InstanceID)
		rec := a.record(inst)
		last = &rec
		a.log.Info("stopped instance", zap.String("instance", req.InstanceID))
	}
	a.kickState()
	// The orchestrator asks the machine an instance runs on, so the record
	// is under this machine's key (the only ones its credentials may write).
	key := store.InstanceKey(req.Namespace, a.cfg.Machine.ID, req.InstanceID)
	if req.Forget {
		return a.cfg.Store.DeleteInstance(ctx, key)
	}
	rec, _, err := a.cfg.Store.GetInstance(ctx, key)
	if err != nil {
		return nil
	}
	if last != nil {
		// What the agent last saw of it (its observations may not all be
		// in the store yet), under the record's key.
		last.Namespace, last.Machine, last.ID = rec.Namespace, rec.Machine, rec.ID
		rec = last
	}
	// Newer than any observation of this run: the stop is what a reader
	// takes.
	rec.State, rec.UpdatedAt = store.InstanceStopped, time.Now().UTC()
	return a.writeRecord(ctx, rec)
}

// beginStop marks inst stopping, so its watcher and healer leave it alone,
// cancels a restart it waits for, and returns its run (nil for none).
func (a *Agent) beginStop(inst *instance) runtime.Handle {
	a.mu.Lock()
	defer a.mu.Unlock()
	if inst.healCancel != nil {
		close(inst.healCancel)
		inst.healCancel = nil
	}
	inst.stopping = true
	return inst.handle
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
