package deploy

import (
	"context"
	"fmt"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// Step 9 of an apply: wait for the gateways to serve the new routing and
// for their layer-4 connections to what the commit no longer routes to to
// drain (layer4.go), then stop it.

// stopSlots stops and forgets the instances of slots (see stopAll); the
// stops are not cut short by the apply's own end.
func (r *run) stopSlots(slots []SlotAction) []store.CleanupFailure {
	recs := make([]*store.InstanceRecord, len(slots))
	for i, a := range slots {
		recs[i] = &store.InstanceRecord{ID: a.InstanceID, Namespace: r.ns, Service: a.Service, Machine: a.Machine}
	}
	return r.d.stopAll(context.Background(), r.ns, recs)
}

// drainOld waits (bounded) for live gateways to apply the new routing and
// to drain their layer-4 connections to what stops, then a drain grace,
// then stops what the commit no longer routes to. Failures
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
	// Layer-4 connections to what stops drain first: a connection lives
	// far longer than a request.
	var prev *store.Manifest
	if r.st.live != nil {
		prev = &r.st.live.Manifest
	}
	stopping := map[string]string{}
	for _, a := range stops {
		stopping[a.InstanceID] = a.Service
	}
	for _, w := range d.waitLayer4Drains(ctx, r.ns, r.status.RoutingSeq, layer4Stops(stopping, prev, r.m)) {
		w = "still draining at the drain timeout, stopped anyway: " + w
		r.status.Warnings = append(r.status.Warnings, w)
		d.printf("warning: %s", w)
	}
	if len(stops) > 0 {
		_ = d.drainGrace(ctx)
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

// waitGateways waits, at most GatewayWait, for every live gateway to
// apply seq (routing.WaitApplied).
func (d *Deployer) waitGateways(ctx context.Context, seq uint64) (serving, total int, laggards []string) {
	return routing.WaitApplied(ctx, d.s, seq, d.opts.GatewayWait)
}

// drainGrace lets requests an instance took before the gateways stopped
// routing to it finish: the pause after the gateway wait and before a
// stop, whatever stops it (a deploy's drain, an abort, the completer). It
// returns early with ctx's error.
func (d *Deployer) drainGrace(ctx context.Context) error {
	select {
	case <-time.After(d.opts.DrainGrace):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
