package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

// run is one apply in progress.
type run struct {
	d      *Deployer
	m      *store.Manifest
	ns     string
	id     string
	lease  *store.Lease
	plan   *Plan
	st     *state
	status *store.DeployStatus
	// started are candidates a machine accepted, to stop on abort.
	started []SlotAction
	// claimed are the hosts this apply took for the namespace, given back
	// on abort.
	claimed []string
}

// intent says what kind of deploy an apply is, beyond its manifest.
type intent struct {
	rollbackOf string
	destroy    bool
}

func (d *Deployer) apply(ctx context.Context, m *store.Manifest, in intent) (*store.DeployStatus, error) {
	if err := manifest.Validate(m); err != nil {
		var me *manifest.Error
		if errors.As(err, &me) {
			return nil, me.Structured()
		}
		return nil, err
	}
	r := &run{d: d, m: m, ns: m.Namespace, id: newDeployID()}
	d.mu.Lock()
	d.lastStep = time.Now()
	d.mu.Unlock()

	// 1. Preview against stored intent. A host another namespace owns is
	// refused here, before anything is written.
	routed := hosts.OfManifest(m)
	if err := hosts.Check(ctx, d.s, r.ns, routed); err != nil {
		return nil, err
	}
	st, err := d.load(ctx, r.ns)
	if err != nil {
		return nil, err
	}
	p := buildPlan(m, st.live, st.insts, st.machines)
	start, keep, stop := p.Counts()
	d.step(StepPreview, "deploy %s of %s, revision %d: %d to start, %d to keep, %d to stop", r.id, r.ns, p.Revision, start, keep, stop)
	failpoint.Hit("after_preview")

	// 2. The namespace deploy lease; a second apply fails here at once.
	lease, err := d.acquireDeployLease(ctx, r.ns, "deploy "+r.id)
	if err != nil {
		return nil, err
	}
	r.lease = lease
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lease.Release(rctx)
	}()
	d.step(StepLease, "holding %s (token %d)", lease.Key(), lease.Token())
	failpoint.Hit("after_lease")
	// Read the state again (it may have moved between the preview and the
	// lease), finish what an interrupted operation on this namespace left,
	// then plan. Finishing writes statuses and routing only, none of what
	// was read.
	if r.st, err = d.load(ctx, r.ns); err != nil {
		return nil, err
	}
	if err := d.complete(ctx, r.ns, lease, r.st.live); err != nil {
		return nil, err
	}
	// Images become digests here, once: the plan compares specs with
	// them, and the commit records them.
	if err := d.pinImages(ctx, r.m, r.st); err != nil {
		return nil, err
	}
	r.plan = buildPlan(m, r.st.live, r.st.insts, r.st.machines)

	// 3. Probe machines for live capacity; place new slots on those that
	// answered. Nothing is written yet, so failing here changes nothing.
	if err := r.probeAndPlace(ctx); err != nil {
		return nil, err
	}
	failpoint.Hit("after_probe")

	// 4. The first durable writes: applying status and pending phases,
	// then the hosts become the namespace's. From here on a failure
	// aborts: the status says why, and an orchestrator that dies leaves a
	// status `control server` finishes.
	if err := lease.Check(ctx); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	r.status = &store.DeployStatus{
		Namespace: r.ns, DeployID: r.id, Revision: r.plan.Revision, State: store.DeployApplying,
		Phase: StepStatus.Name(), RollbackOf: in.rollbackOf, Destroy: in.destroy, StartedAt: now,
	}
	if err := d.putStatus(ctx, r.status); err != nil {
		return nil, err
	}
	for s := StepPreview; s <= StepDrainOld; s++ {
		state := store.PhasePending
		if s <= StepStatus {
			state = store.PhaseDone
		}
		if err := d.putPhase(ctx, r.ns, r.id, s, state, "", 0); err != nil {
			return nil, err
		}
	}
	// Checked again under the hosts lease: another namespace may have
	// claimed one since the preview.
	if r.claimed, err = hosts.Claim(ctx, d.s, r.ns, r.id, routed); err != nil {
		return r.abort(ctx, err)
	}
	d.step(StepStatus, "status applying, %d phase records pending", NumSteps-int(StepStatus))
	failpoint.Hit("after_status")

	// 5. Start candidates and wait for readiness. Any failure aborts.
	if err := r.startCandidates(ctx); err != nil {
		return r.abort(ctx, err)
	}
	failpoint.Hit("after_candidates")

	// 6. Checkpoint commits belong to intermediate phases (volume moves);
	// an apply without them has nothing to checkpoint.
	r.phase(ctx, StepCheckpoint, store.PhaseSkipped, "no intermediate phases", 0)
	d.step(StepCheckpoint, "no intermediate phases; nothing to checkpoint")
	failpoint.Hit("after_checkpoint")

	// 7. The final commit: the point of no return. The append itself is
	// not interrupted: cut short, it would leave unknown whether the deploy
	// is live.
	r.status.Phase = StepFinalCommit.Name()
	if err := ctx.Err(); err != nil {
		return r.abort(ctx, err)
	}
	if err := lease.Check(ctx); err != nil {
		return r.abort(ctx, err)
	}
	commit := r.finalCommit()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.RPCTimeout)
	seq, err := d.s.AppendCommit(cctx, commit)
	cancel()
	if err != nil {
		return r.abort(ctx, err)
	}
	// The deploy is live: an interruption from here on finishes it first
	// (a second interrupt is not taken; kill -9 leaves it to `control
	// server`).
	stopNotice := context.AfterFunc(ctx, func() {
		d.printf("interrupted after the final commit: deploy %s is live; finishing it (routing events, drain) before exiting", r.id)
	})
	defer stopNotice()
	interrupted := ctx
	ctx = context.WithoutCancel(ctx)
	failpoint.Hit("after_final_commit")
	r.status.State, r.status.CommitSeq, r.status.Phase = store.DeployCommitted, seq, StepFinalCommit.Name()
	r.writeStatus(ctx)
	r.phase(ctx, StepFinalCommit, store.PhaseDone, "commit "+commit.ID, seq)
	d.step(StepFinalCommit, "committed %s revision %d at sequence %d; this deploy is live", commit.ID, commit.Revision, seq)

	// 8. Routing events derived from the commit.
	if err := d.publish(ctx, r.status, commit, r.st.live); err != nil {
		// The deploy is live; the next operation on the namespace finishes
		// publishing. Say so rather than pretend it failed.
		r.status.Warnings = append(r.status.Warnings, "routing events not yet published: "+err.Error())
		r.writeStatus(ctx)
		return r.status, store.Errorf(store.CodeUnavailable,
			"deploy %s is committed but its routing events could not be published (%v); the next `control deploy` on %s or `control server` start publishes them",
			r.id, err, r.ns).With("deploy", r.id)
	}
	failpoint.Hit("after_publish")
	r.phase(ctx, StepPublishRouting, store.PhaseDone, fmt.Sprintf("routing sequence %d", r.status.RoutingSeq), 0)
	d.step(StepPublishRouting, "published routing events up to sequence %d", r.status.RoutingSeq)

	// 9. Wait for gateways, let in-flight requests finish, stop the old;
	// the hosts the namespace no longer routes are free from then on.
	r.drainOld(ctx)
	if err := hosts.KeepOnly(ctx, d.s, r.ns, routed); err != nil {
		r.status.Warnings = append(r.status.Warnings, "releasing hosts no longer routed: "+err.Error())
	}
	failpoint.Hit("after_drain")
	r.status.Phase = StepDrainOld.Name()
	r.status.Settled = len(r.status.Cleanup) == 0
	if interrupted.Err() != nil {
		r.status.Warnings = append(r.status.Warnings, "interrupted after the final commit; finished before exiting")
	}
	r.writeStatus(ctx)
	if interrupted.Err() != nil {
		d.printf("deploy %s finished after the interrupt: revision %d is served", r.id, r.status.Revision)
	}
	return r.status, nil
}

// completerWait bounds how long an apply waits for a control server that
// is finishing the namespace's abandoned deploy (seconds, usually).
const completerWait = 2 * time.Minute

// acquireDeployLease takes ns's deploy lease for purpose. A lease another
// orchestrator holds fails at once (two applies never queue); one the
// control server holds to finish an abandoned deploy is waited for, since
// it is about to be free.
func (d *Deployer) acquireDeployLease(ctx context.Context, ns, purpose string) (*store.Lease, error) {
	deadline := time.Now().Add(completerWait)
	said := false
	for {
		lease, err := d.s.AcquireLease(ctx, store.DeployLockKey(ns), store.LeaseOptions{
			TTL: d.opts.LeaseTTL, Holder: d.opts.Holder, Purpose: purpose, KeepAlive: true,
		})
		se := store.AsError(err)
		if err == nil || se.Code != store.CodeBusy || se.Detail["purpose"] != completerPurpose || time.Now().After(deadline) {
			return lease, err
		}
		if !said {
			d.printf("waiting for %s to finish an abandoned deploy of %s", se.Detail["holder"], ns)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, store.Errorf(CodeInterrupted, "interrupted while waiting for the namespace lease of %s", ns).With("namespace", ns)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// phase writes a phase record; after the final commit a failed status write
// is reported but cannot undo the commit.
func (r *run) phase(ctx context.Context, s Step, state, detail string, seq uint64) {
	if err := r.d.putPhase(ctx, r.ns, r.id, s, state, detail, seq); err != nil {
		r.d.printf("warning: recording phase %s: %v", s, err)
	}
}

func (r *run) writeStatus(ctx context.Context) {
	if err := r.d.putStatus(ctx, r.status); err != nil {
		r.d.printf("warning: recording deploy status: %v", err)
	}
}

// probeAndPlace places the new slots and asks only the machines it means
// to use (and those that run kept instances) for their live capacity.
// Candidates come from what agents last wrote of their machines (fresh
// heartbeat, free slots); a machine that fails its probe, or has less room
// than it said, is set aside and the slots are placed again, a few rounds
// at most. A machine without any heartbeat (an older agent) is a candidate
// too: its probe decides. Nothing is written here.
func (r *run) probeAndPlace(ctx context.Context) error {
	d := r.d
	states, beats, err := r.st.observations(ctx, d.s)
	if err != nil {
		return err
	}
	now := time.Now()
	keep := map[string]bool{}
	for _, a := range r.plan.Actions {
		if a.Action == ActionKeep {
			keep[a.Machine] = true
		}
	}
	probed := map[string]*store.CapacityReply{}
	down := map[string]error{}
	var downList []string
	for round := 0; ; round++ {
		var cands []*candidate
		for _, id := range slices.Sorted(maps.Keys(r.st.machines)) {
			m := r.st.machines[id]
			if _, gone := down[id]; gone || m.State != store.MachineActive {
				continue
			}
			c := &candidate{rec: m, perService: map[string]int{}}
			switch rep, st := probed[id], states[id]; {
			case rep != nil:
				c.free, c.load, c.noEngine = rep.Free, rep.Instances, !slices.Contains(rep.Drivers, "container")
			case beats[id].Machine == "":
				// Never beat: no observation to go by; its probe decides.
				c.free = 1 << 30
			default:
				if b := beats[id]; b.Liveness(now) != store.MachineFresh {
					continue
				}
				c.free, c.load, c.noEngine = st.Free, st.Instances, st.Machine != "" && !slices.Contains(st.Drivers, "container")
				if st.Machine == "" {
					c.free = 1 << 30
				}
			}
			cands = append(cands, c)
		}
		if err := place(r.plan, cands); err != nil {
			if len(downList) > 0 {
				store.AsError(err).With("unavailable", strings.Join(downList, "; "))
			}
			return err
		}
		want := map[string]int{}
		for _, a := range r.plan.Actions {
			if a.Action == ActionStart {
				want[a.Machine]++
			}
		}
		var ask []string
		for id := range keep {
			if probed[id] == nil {
				ask = append(ask, id)
			}
		}
		for id := range want {
			if probed[id] == nil && !keep[id] {
				ask = append(ask, id)
			}
		}
		sort.Strings(ask)
		short := false
		for i, p := range machines.Probe(ctx, d.s, ask, d.opts.ProbeTimeout) {
			id := ask[i]
			if p.Err != nil {
				// A machine that runs a kept instance is required: without
				// it the new commit would route to a machine nobody can
				// vouch for.
				if keep[id] {
					return p.Err
				}
				down[id] = p.Err
				downList = append(downList, fmt.Sprintf("%s (%v)", id, p.Err))
				short = true
				continue
			}
			probed[id] = p.Reply
			if p.Reply.Free < want[id] {
				short = true // it has less room than it said: place again with the truth
			}
		}
		if !short {
			break
		}
		if round == 3 {
			return store.Errorf(store.CodeUnavailable, "placement did not settle: machines kept failing their probes").
				With("unavailable", strings.Join(downList, "; "))
		}
	}
	msg := fmt.Sprintf("%d machines asked, %d answered", len(probed)+len(down), len(probed))
	if len(downList) > 0 {
		msg += "; not used: " + strings.Join(downList, "; ")
	}
	d.step(StepProbe, "%s", msg)
	return nil
}

// pinImages resolves every image of m to its ID on the active
// machines that have a container engine (as their heartbeats and states
// say), which must all agree; an image
// the manifest already pins (a rollback to a commit) must be present on
// each. Nothing is written: a failure here changes nothing.
func (d *Deployer) pinImages(ctx context.Context, m *store.Manifest, st *state) error {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		if m.Services[name].Image != "" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	// The machines with an engine, as their agents last said (fresh
	// heartbeat); one that never sent a heartbeat is asked.
	states, beats, err := st.observations(ctx, d.s)
	if err != nil {
		return err
	}
	now := time.Now()
	var engines, ask []string
	for _, id := range slices.Sorted(maps.Keys(st.machines)) {
		if st.machines[id].State != store.MachineActive {
			continue
		}
		b, seen := beats[id]
		switch {
		case !seen:
			ask = append(ask, id)
		case b.Liveness(now) == store.MachineFresh && slices.Contains(states[id].Drivers, "container"):
			engines = append(engines, id)
		}
	}
	for i, p := range machines.Probe(ctx, d.s, ask, d.opts.ProbeTimeout) {
		if p.Err == nil && slices.Contains(p.Reply.Drivers, "container") {
			engines = append(engines, ask[i])
		}
	}
	sort.Strings(engines)
	for _, name := range names {
		spec := m.Services[name]
		if len(engines) == 0 {
			return store.Errorf(store.CodeUnavailable, "no reachable active machine has a container engine for %s.%s (image %s)", m.Namespace, name, spec.Image).
				With("service", name).With("image", spec.Image)
		}
		ref := spec.Image
		if spec.ImageID != "" {
			ref = spec.ImageID
		}
		// Every engine at once: each is an image store lookup, or a pull.
		reps := make([]store.ResolveImageReply, len(engines))
		errs := make([]error, len(engines))
		var wg sync.WaitGroup
		for i, m := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, d.opts.RPCTimeout+time.Minute) // a pull may take a while
				defer cancel()
				errs[i] = d.s.Call(cctx, m, store.CmdResolveImage, store.ResolveImageRequest{Image: ref}, &reps[i])
			}()
		}
		wg.Wait()
		var got, first string
		var silent []string
		for i, m := range engines {
			rep, err := reps[i], errs[i]
			switch {
			case store.HasCode(err, store.CodeRPCFailure):
				// Not answering: placement will not use it either.
				silent = append(silent, m)
			case err != nil && spec.ImageID != "" && store.HasCode(err, store.CodeNotFound):
				return store.Errorf(store.CodeNotFound, "image %s as this deploy pins it (%s) is no longer on machine %s; nothing was started",
					spec.Image, spec.ImageID, m).With("service", name).With("image", spec.Image).With("image_id", spec.ImageID).With("machine", m)
			case err != nil:
				return err
			case got == "":
				got, first = rep.ID, m
			case rep.ID != got:
				return store.Errorf(store.CodeConflict, "image %s is %s on machine %s but %s on %s: give every machine the same image, or name it by digest",
					spec.Image, got, first, rep.ID, m).With("service", name).With("image", spec.Image)
			}
		}
		if got == "" {
			return store.Errorf(store.CodeUnavailable, "no machine with a container engine answered for %s.%s (image %s): %s",
				m.Namespace, name, spec.Image, strings.Join(silent, ", ")).With("service", name).With("image", spec.Image)
		}
		spec.ImageID = got
		m.Services[name] = spec
		d.printf("       %s.%s: image %s is %s (%d machines with an engine answered)", m.Namespace, name, spec.Image, shortID(got), len(engines)-len(silent))
	}
	return nil
}

func shortID(id string) string {
	if len(id) > len("sha256:")+12 {
		return id[:len("sha256:")+12]
	}
	return id
}

type candResult struct {
	a   SlotAction
	err error
}

func (r *run) startCandidates(ctx context.Context) error {
	d := r.d
	r.status.Phase = StepStartCandidates.Name()
	r.writeStatus(ctx)
	r.phase(ctx, StepStartCandidates, store.PhaseRunning, "", 0)
	var starts []SlotAction
	for _, a := range r.plan.Actions {
		if a.Action == ActionStart {
			starts = append(starts, a)
		}
	}
	if len(starts) == 0 {
		r.phase(ctx, StepStartCandidates, store.PhaseDone, "no candidates", 0)
		d.step(StepStartCandidates, "no candidates to start")
		return nil
	}
	results := make([]candResult, len(starts))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	// A machine that dies while its candidates warm up fails the apply
	// as soon as it stops answering, not when readiness times out.
	var ids []string
	for _, a := range starts {
		if !slices.Contains(ids, a.Machine) {
			ids = append(ids, a.Machine)
		}
	}
	wctx, cancelWait := context.WithCancelCause(ctx)
	defer cancelWait(nil)
	stopWatch := r.watchMachines(wctx, ids, cancelWait)
	defer stopWatch()
	ctx = wctx
	for i, a := range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			accepted, err := r.startOne(ctx, a)
			if accepted {
				mu.Lock()
				r.started = append(r.started, a)
				mu.Unlock()
			}
			results[i] = candResult{a: a, err: err}
		}()
	}
	wg.Wait()
	stopWatch()
	if cause := context.Cause(wctx); cause != nil && errors.As(cause, new(*machineDown)) {
		return cause
	}
	var failed []string
	var first error
	for _, res := range results {
		if res.err != nil {
			failed = append(failed, fmt.Sprintf("%s on %s: %v", res.a.InstanceID, res.a.Machine, res.err))
			if first == nil {
				first = res.err
			}
		}
	}
	if first != nil {
		e := store.AsError(first)
		out := &store.Error{Code: e.Code, Message: fmt.Sprintf("%d of %d candidates failed: %s", len(failed), len(starts), strings.Join(failed, "; ")),
			Detail: map[string]string{"phase": StepStartCandidates.Name()}}
		for k, v := range e.Detail {
			out.Detail[k] = v
		}
		return out
	}
	r.phase(ctx, StepStartCandidates, store.PhaseDone, fmt.Sprintf("%d candidates ready", len(starts)), 0)
	d.step(StepStartCandidates, "%d candidates started and ready", len(starts))
	return nil
}

// machineDown is why an apply stopped waiting for readiness: a machine
// with candidates stopped answering.
type machineDown struct{ err *store.Error }

func (e *machineDown) Error() string { return e.err.Error() }
func (e *machineDown) Unwrap() error { return e.err }

// Liveness checks of the machines that warm up candidates: one capacity
// call each per interval; a machine fails when two in a row go unanswered.
const (
	livenessInterval = time.Second
	livenessRetry    = 250 * time.Millisecond
)

// watchMachines checks, until the returned stop is called, that every
// machine in ids still answers; the first that does not ends the wait with
// a machineDown naming it.
func (r *run) watchMachines(ctx context.Context, ids []string, fail context.CancelCauseFunc) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	timeout := min(r.d.opts.ProbeTimeout, r.d.opts.RPCTimeout)
	ping := func(id string) error {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return r.d.s.Call(pctx, id, store.CmdCapacity, store.CapacityRequest{}, &store.CapacityReply{})
	}
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(livenessInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				err := ping(id)
				if err == nil || ctx.Err() != nil || !store.HasCode(err, store.CodeRPCFailure) {
					continue
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(livenessRetry):
				}
				if err = ping(id); err == nil || ctx.Err() != nil || !store.HasCode(err, store.CodeRPCFailure) {
					continue
				}
				fail(&machineDown{err: store.Errorf(store.CodeUnavailable,
					"machine %s stopped answering while its candidates warmed up (%v); the apply stops here, before the final commit", id, err).
					With("machine", id).With("phase", StepStartCandidates.Name())})
				return
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// startOne starts one candidate and waits for readiness. accepted reports
// whether the machine may be running it (so abort must stop it).
func (r *run) startOne(ctx context.Context, a SlotAction) (accepted bool, err error) {
	d := r.d
	spec := r.m.Services[a.Service]
	req := store.StartRequest{
		Instance: store.InstanceRecord{
			Version: store.RecordVersion, ID: a.InstanceID, Namespace: r.ns, Service: a.Service, Slot: a.Slot,
			Revision: a.Revision, DeployID: r.id, SpecHash: a.SpecHash, Machine: a.Machine,
		},
		Spec: spec,
	}
	sctx, cancel := context.WithTimeout(ctx, d.opts.RPCTimeout)
	var rep store.StartReply
	err = d.s.Call(sctx, a.Machine, store.CmdStartCandidate, req, &rep)
	cancel()
	if err != nil {
		// A timeout leaves it unknown whether the machine started it.
		return store.HasCode(err, store.CodeRPCFailure), err
	}
	timeout := manifest.ReadinessTimeout(spec)
	rctx, cancel := context.WithTimeout(ctx, timeout+d.opts.RPCTimeout)
	defer cancel()
	var ready store.ReadinessReply
	if err := d.s.Call(rctx, a.Machine, store.CmdReadiness,
		store.ReadinessRequest{InstanceID: a.InstanceID, Namespace: r.ns, Timeout: store.Duration(timeout)}, &ready); err != nil {
		return true, err
	}
	if !ready.Ready {
		return true, store.Errorf(store.CodeUnavailable, "instance %s never became ready: %s", a.InstanceID, ready.Error).
			With("instance", a.InstanceID).With("machine", a.Machine)
	}
	d.printf("       %s.%s slot %d: %s ready on %s (%s:%d)", r.ns, a.Service, a.Slot, a.InstanceID, a.Machine, ready.Instance.Address, ready.Instance.Port)
	return true, nil
}

// releaseClaims gives back the hosts this apply claimed: it routes none of
// them.
func (r *run) releaseClaims() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hosts.Release(ctx, r.d.s, r.ns, r.claimed); err != nil {
		r.d.printf("warning: releasing hosts %s: %v", strings.Join(r.claimed, ", "), err)
	}
}

// abort undoes an apply that failed before its final commit: candidates are
// stopped and forgotten, the status says failed and why. The live revision
// never stopped serving. An apply whose ctx ended (Ctrl-C) is recorded as
// interrupted, whatever the step it ended in.
func (r *run) abort(applyCtx context.Context, cause error) (*store.DeployStatus, error) {
	d := r.d
	if applyCtx.Err() != nil {
		cause = store.Errorf(CodeInterrupted, "interrupted during %s, before the final commit: candidates stopped, nothing routed", r.status.Phase).
			With("phase", r.status.Phase).With("deploy", r.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.StopGrace+d.opts.RPCTimeout)
	defer cancel()
	for _, c := range r.stopSlots(r.started) {
		d.printf("warning: stopping candidate %s on %s: %s", c.InstanceID, c.Machine, c.Error)
		r.status.Cleanup = append(r.status.Cleanup, c)
	}
	r.releaseClaims()
	se := store.AsError(cause)
	r.status.State, r.status.Error = store.DeployFailed, se
	r.status.Settled = len(r.status.Cleanup) == 0
	r.writeStatus(ctx)
	for s := StepStartCandidates; s <= StepDrainOld; s++ {
		state := store.PhaseSkipped
		if s.Name() == r.status.Phase {
			state = store.PhaseFailed
		}
		r.phase(ctx, s, state, "", 0)
	}
	verb := "failed"
	if se.Code == CodeInterrupted {
		verb = "was interrupted"
	}
	d.printf("deploy %s %s before the final commit; %d candidates stopped; nothing was routed, the previous revision keeps serving",
		r.id, verb, len(r.started)-len(r.status.Cleanup))
	return r.status, se
}

// stopSlots stops and forgets the instances of slots (see stopAll); the
// stops are not cut short by the apply's own end.
func (r *run) stopSlots(slots []SlotAction) []store.CleanupFailure {
	recs := make([]*store.InstanceRecord, len(slots))
	for i, a := range slots {
		recs[i] = &store.InstanceRecord{ID: a.InstanceID, Namespace: r.ns, Service: a.Service, Machine: a.Machine}
	}
	return r.d.stopAll(context.Background(), r.ns, recs)
}

func (r *run) finalCommit() *store.DeployCommit {
	c := &store.DeployCommit{
		ID: r.id, Namespace: r.ns, Kind: store.CommitFinal, Revision: r.plan.Revision,
		Manifest: *r.m, ManifestHash: manifest.Hash(r.m), RollbackOf: r.status.RollbackOf, Destroy: r.status.Destroy,
		CreatedAt: time.Now().UTC(),
	}
	if live := r.st.live; live != nil {
		c.Replaces, c.ReplacesSeq = live.ID, live.Seq
	}
	for _, a := range r.plan.Actions {
		if a.Action == ActionStart || a.Action == ActionKeep {
			c.Slots = append(c.Slots, store.SlotAssignment{
				Service: a.Service, Slot: a.Slot, InstanceID: a.InstanceID, Machine: a.Machine,
				Revision: a.Revision, SpecHash: a.SpecHash,
			})
		}
	}
	return c
}

// drainOld waits (bounded) for live gateways to apply the new routing, then
// a drain grace, then stops what the commit no longer routes to. Failures
// are recoverable status, never a revert.
func (r *run) drainOld(ctx context.Context) {
	d := r.d
	r.phase(ctx, StepDrainOld, store.PhaseRunning, "", 0)
	serving, total, laggards := d.waitGateways(ctx, r.status.RoutingSeq)
	r.status.Gateways = fmt.Sprintf("%d/%d", serving, total)
	d.printf("       %d/%d gateways serving revision %d", serving, total, r.status.Revision)
	for _, g := range laggards {
		w := fmt.Sprintf("gateway %s has not applied routing sequence %d after %s", g, r.status.RoutingSeq, d.opts.GatewayWait)
		r.status.Warnings = append(r.status.Warnings, w)
		d.printf("warning: %s", w)
	}
	var stops []SlotAction
	for _, a := range r.plan.Actions {
		if a.Action == ActionStop {
			stops = append(stops, a)
		}
	}
	if len(stops) > 0 {
		select {
		case <-time.After(d.opts.DrainGrace):
		case <-ctx.Done():
		}
	}
	r.status.Cleanup = append(r.status.Cleanup, r.stopSlots(stops)...)
	detail := fmt.Sprintf("%d stopped", len(stops)-len(r.status.Cleanup))
	if n := len(r.status.Cleanup); n > 0 {
		detail += fmt.Sprintf(", %d cleanup failures (recoverable; retried by the next apply)", n)
		for _, c := range r.status.Cleanup {
			d.printf("warning: could not stop old instance %s on %s: %s", c.InstanceID, c.Machine, c.Error)
		}
	}
	r.phase(ctx, StepDrainOld, store.PhaseDone, detail, 0)
	d.step(StepDrainOld, "%d gateways of %d serving revision %d; old instances: %s", serving, total, r.status.Revision, detail)
}

// waitGateways watches the gateways' observations until every live gateway
// has applied seq or GatewayWait passes (the reports present at the start
// are always read in full). It returns who is serving, how many
// gateways report at all, and the names of those that lag.
func (d *Deployer) waitGateways(ctx context.Context, seq uint64) (serving, total int, laggards []string) {
	obs := map[string]store.GatewayObservation{} // by key
	judge := func() bool {
		serving, total, laggards = 0, 0, nil
		for _, g := range obs {
			// A gateway whose report aged out is not live; the bucket TTL
			// removes it, this check covers the time until then.
			if time.Since(g.At) >= store.GatewayObservationTTL {
				continue
			}
			total++
			if g.AppliedSeq >= seq {
				serving++
			} else {
				laggards = append(laggards, g.Gateway)
			}
		}
		sort.Strings(laggards)
		return len(laggards) == 0
	}
	// One watch for the whole wait: the current reports, then each new one.
	w, err := d.s.Gateways.Watch(ctx, ">")
	if err != nil {
		judge()
		return
	}
	defer w.Stop()
	caughtUp, expired := false, false
	deadline := time.NewTimer(d.opts.GatewayWait)
	defer deadline.Stop()
	aging := time.NewTicker(time.Second) // reports age out without an update
	defer aging.Stop()
	for {
		select {
		case <-ctx.Done():
			judge()
			return
		case <-deadline.C:
			expired = true
		case <-aging.C:
		case ent, ok := <-w.Updates():
			switch {
			case !ok:
				judge()
				return
			case ent == nil:
				caughtUp = true
			case ent.Operation() != jetstream.KeyValuePut:
				delete(obs, ent.Key())
			default:
				// A report under another gateway's name is not taken.
				var g store.GatewayObservation
				if store.DecodeKeyed(d.s.Gateways.Bucket(), ent.Key(), ent.Value(), &g) == nil {
					obs[ent.Key()] = g
				}
			}
		}
		if caughtUp && (judge() || expired) {
			return
		}
	}
}
