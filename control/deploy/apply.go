package deploy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/hosts"
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
	// claimed are the hosts and ports this apply took for the namespace,
	// given back on abort.
	claimed hosts.Wanted
	// checkpoint is the latest canary step this apply committed: an
	// abort routes the namespace back before it stops the candidates.
	checkpoint *store.DeployCommit
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

	// 1. Preview against stored intent. A host or port another namespace
	// owns is refused here, before anything is written.
	routed := hosts.Of(m)
	if err := hosts.Check(ctx, d.s, r.ns, routed); err != nil {
		return nil, err
	}
	if err := gatewaysServe(ctx, d.s, m); err != nil {
		return nil, err
	}
	st, err := d.load(ctx, r.ns)
	if err != nil {
		return nil, err
	}
	// A rollback deploys a spec that was valid once: a region it names
	// that has since gone is placement's to refuse, not a reason to hold
	// back the way out.
	if in.rollbackOf == "" {
		if err := checkRegions(m, st); err != nil {
			return nil, err
		}
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
	defer d.releaseLease(lease)
	d.step(StepLease, "holding %s (token %d)", lease.Key(), lease.Token())
	failpoint.Hit("after_lease")
	// Read the state again (it may have moved between the preview and the
	// lease), finish what an interrupted operation on this namespace left,
	// then plan. Finishing writes statuses and routing only, none of what
	// was read.
	if r.st, err = d.load(ctx, r.ns); err != nil {
		return nil, err
	}
	if live, err := d.complete(ctx, r.ns, lease, r.st.live); err != nil {
		return nil, err
	} else if live != r.st.live {
		// An abandoned canary was promoted: plan against it.
		if r.st, err = d.load(ctx, r.ns); err != nil {
			return nil, err
		}
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
	// claimed a host or port since the preview.
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

	// 6. Checkpoint commits belong to intermediate phases: the steps of a
	// canary. An apply without them has nothing to checkpoint.
	if why := r.canaryPhase(); why != "" {
		r.phase(ctx, StepCheckpoint, store.PhaseSkipped, why, 0)
		d.step(StepCheckpoint, "%s; nothing to checkpoint", why)
	} else if err := r.runCanary(ctx); err != nil {
		return r.abort(ctx, err)
	}
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
	// the hosts and ports the namespace no longer wants are free from then
	// on.
	r.drainOld(ctx)
	if err := hosts.KeepOnly(ctx, d.s, r.ns, routed); err != nil {
		r.status.Warnings = append(r.status.Warnings, "releasing hosts and ports no longer routed: "+err.Error())
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
func (r *run) phase(ctx context.Context, s Step, state store.PhaseState, detail string, seq uint64) {
	if err := r.d.putPhase(ctx, r.ns, r.id, s, state, detail, seq); err != nil {
		r.d.printf("warning: recording phase %s: %v", s, err)
	}
}

func (r *run) writeStatus(ctx context.Context) {
	if err := r.d.putStatus(ctx, r.status); err != nil {
		r.d.printf("warning: recording deploy status: %v", err)
	}
}

// releaseClaims gives back the hosts and ports this apply claimed: it
// routes none of them.
func (r *run) releaseClaims() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hosts.Release(ctx, r.d.s, r.ns, r.claimed); err != nil {
		r.d.printf("warning: releasing %s: %v", r.claimed, err)
	}
}

// abort undoes an apply that failed before its final commit: candidates are
// stopped and forgotten, the status says failed and why. The live revision
// never stopped serving. An apply whose ctx ended (Ctrl-C) is recorded as
// interrupted, whatever the step it ended in.
func (r *run) abort(applyCtx context.Context, cause error) (*store.DeployStatus, error) {
	d := r.d
	switch {
	case applyCtx.Err() != nil && r.checkpoint != nil:
		cause = store.Errorf(CodeInterrupted, "interrupted during canary step %d, before the final commit: routed back to revision %d, candidates stopped",
			r.checkpoint.Canary.Step, r.st.live.Revision).With("phase", r.status.Phase).With("deploy", r.id)
	case applyCtx.Err() != nil:
		cause = store.Errorf(CodeInterrupted, "interrupted during %s, before the final commit: candidates stopped, nothing routed", r.status.Phase).
			With("phase", r.status.Phase).With("deploy", r.id)
	}
	// Bounded: the stops, the gateway wait, the grace and the candidates'
	// layer-4 drains (none without layer-4 entry points).
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.StopGrace+d.opts.RPCTimeout+d.opts.GatewayWait+d.opts.DrainGrace+maxL4Bound(r.m))
	defer cancel()
	state := store.DeployFailed
	if r.checkpoint != nil {
		// The candidates served part of the traffic: the gateways route
		// it all back before they stop.
		state = store.DeployFailedAfterCheckpoint
		seq, err := d.routeBack(ctx, r.checkpoint, r.st.live)
		if err != nil {
			// The completer finishes the canary once the lease is free;
			// the decision makes it abort whatever the figures say.
			derr := d.s.PutCanaryDecision(ctx, &store.CanaryDecision{Namespace: r.ns, DeployID: r.id,
				Action: store.DecisionAbort, By: "the apply (" + store.AsError(cause).Message + ")"})
			if derr != nil {
				d.printf("warning: recording the abort: %v", derr)
			}
			d.printf("warning: %v; the control plane routes it back when the lease is free", err)
			r.status.Warnings = append(r.status.Warnings, err.Error())
			r.status.Error = store.AsError(cause)
			r.writeStatus(ctx)
			return r.status, store.AsError(cause)
		}
		// The gateways route it all back; requests the candidates took
		// before that finish first, as a replaced instance's do
		// (drainOld): stopped at once, a slow candidate's would be cut.
		// Layer-4 connections they took drain as a replaced instance's.
		l4 := d.waitLayer4Drains(ctx, r.ns, seq, layer4Stops(r.startedServices(), r.m))
		for _, w := range l4 {
			d.printf("warning: still draining at the drain timeout: %s", w)
		}
		d.drainGrace(ctx)
	}
	for _, c := range r.stopSlots(r.started) {
		d.printf("warning: stopping candidate %s on %s: %s", c.InstanceID, c.Machine, c.Error)
		r.status.Cleanup = append(r.status.Cleanup, c)
	}
	r.releaseClaims()
	se := store.AsError(cause)
	r.status.State, r.status.Error = state, se
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
	if r.checkpoint != nil {
		d.printf("deploy %s %s during its canary; revision %d serves everything again; %d candidates stopped",
			r.id, verb, r.st.live.Revision, len(r.started)-len(r.status.Cleanup))
		return r.status, se
	}
	d.printf("deploy %s %s before the final commit; %d candidates stopped; nothing was routed, the previous revision keeps serving",
		r.id, verb, len(r.started)-len(r.status.Cleanup))
	return r.status, se
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
