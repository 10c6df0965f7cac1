package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

// Step 5 of an apply: candidates start and become ready, while the
// machines warming them up are watched so a dead one fails the apply at
// once.

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
