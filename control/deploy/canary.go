package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// Step 6 of an apply with a rollout: the canary. Each step appends a
// checkpoint commit carrying its weight and publishes the routing that
// splits every changed service between the live instances and the
// candidates; once the gateways apply it, the step holds while the
// gateways' counters of both sides are read every CanaryPoll. Within the
// limits the apply goes on (the final commit routes everything to the new
// revision); beyond them, or when an operator says so, it aborts: a
// checkpoint commit marked abort, the live routing published again, then
// the candidates stopped, and the deploy is FailedAfterCheckpoint.

// Error codes of canaries.
const (
	// CodeCanaryAborted: the canary exceeded a limit, or an operator
	// aborted it; the previous revision serves everything again.
	CodeCanaryAborted = "canary_aborted"
)

// CanaryPoll is how often a holding step reads the gateways' counters and
// the operators' decisions.
const CanaryPoll = 500 * time.Millisecond

// canaryPhase returns why the apply takes no canary, or "" when it does:
// a rollout in the manifest, a live commit to measure against, and some
// service the plan starts new instances of.
func (r *run) canaryPhase() string {
	switch {
	case r.m.Rollout == nil || len(r.m.Rollout.Steps) == 0:
		return "no intermediate phases"
	case r.status.Destroy:
		return "a destroy has no canary"
	case r.status.RollbackOf != "":
		return "a rollback goes straight to its final commit"
	case r.st.live == nil:
		return "no live revision to measure a canary against"
	}
	for _, a := range r.plan.Actions {
		if a.Action == ActionStart {
			if _, ok := r.st.live.Manifest.Services[a.Service]; ok {
				return ""
			}
		}
	}
	return "no live service gets new instances"
}

// canaryCommit is the checkpoint commit of step (from 1) at weight.
func (r *run) canaryCommit(step, weight int) *store.DeployCommit {
	c := r.finalCommit()
	c.Kind, c.Phase = store.CommitCheckpoint, fmt.Sprintf("canary-%d", step)
	c.Canary = &store.Canary{Step: step, Weight: weight}
	return c
}

// runCanary takes the apply through its rollout's steps. nil means every
// step passed or an operator promoted the canary; any error leaves the
// routing split (r.checkpoint is set) for abort to route back.
func (r *run) runCanary(ctx context.Context) error {
	d, spec := r.d, r.m.Rollout
	limits := spec.Limits.WithDefaults()
	r.status.Phase = StepCheckpoint.Name()
	for i, st := range spec.Steps {
		step := i + 1
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.lease.Check(ctx); err != nil {
			return err
		}
		cp := r.canaryCommit(step, st.Weight)
		seq, err := d.s.AppendCommit(ctx, cp)
		if err != nil {
			return err
		}
		r.checkpoint = cp
		services, routingSeq, err := d.publishCanary(ctx, cp, r.st.live)
		if err != nil {
			return err
		}
		serving, total, _ := d.waitGateways(ctx, routingSeq)
		rec := store.CanaryStepStatus{Step: step, Weight: st.Weight, Hold: st.Hold, CommitSeq: seq,
			StartedAt: time.Now().UTC(), Verdict: store.CanaryHolding}
		r.status.Canary = append(r.status.Canary, rec)
		r.writeStatus(ctx)
		detail := fmt.Sprintf("step %d/%d: %d%% to revision %d, holding %s (%d/%d gateways)", step, len(spec.Steps), st.Weight, r.plan.Revision, st.Hold, serving, total)
		r.phase(ctx, StepCheckpoint, store.PhaseRunning, detail, seq)
		d.printf("       canary %s", detail)
		failpoint.Hit("canary_holding")

		verdict, reason, figs, err := d.holdCanary(ctx, r.ns, r.id, services, limits, time.Duration(st.Hold), total, r.lease.Check)
		cur := &r.status.Canary[len(r.status.Canary)-1]
		cur.EndedAt, cur.Verdict, cur.Reason, cur.Judged = time.Now().UTC(), verdict, reason, figs
		if err != nil {
			cur.Verdict, cur.Reason = store.CanaryAborted, err.Error()
			r.writeStatus(ctx)
			return err
		}
		r.writeStatus(ctx)
		d.printf("       canary step %d %s: %s", step, verdict, reason)
		switch verdict {
		case store.CanaryAborted:
			return store.Errorf(CodeCanaryAborted, "canary step %d (%d%%) aborted: %s", step, st.Weight, reason).
				With("step", fmt.Sprint(step)).With("deploy", r.id)
		case store.CanaryPromoted:
			r.phase(ctx, StepCheckpoint, store.PhaseDone, fmt.Sprintf("promoted at step %d: %s", step, reason), seq)
			d.step(StepCheckpoint, "canary promoted at step %d of %d: %s", step, len(spec.Steps), reason)
			return nil
		}
	}
	r.phase(ctx, StepCheckpoint, store.PhaseDone, fmt.Sprintf("%d canary steps passed", len(spec.Steps)), 0)
	d.step(StepCheckpoint, "%d canary steps passed; promoting revision %d", len(spec.Steps), r.plan.Revision)
	return nil
}

// publishCanary publishes the routing of canary step cp over live and
// returns the services it splits and the last routing sequence.
func (d *Deployer) publishCanary(ctx context.Context, cp, live *store.DeployCommit) ([]string, uint64, error) {
	src, err := routing.SourceOf(ctx, d.s, cp.Namespace)
	if err != nil {
		return nil, 0, err
	}
	events := routing.CanaryBatch(cp, live, src)
	if r := cp.Manifest.Rollout; r != nil && r.Sticky {
		// Gateways sign sticky clients' bucket cookies with the fleet's
		// key; a store provisioned before there was one gets it now.
		if _, err := d.s.EnsureCanaryCookieKey(ctx); err != nil {
			return nil, 0, fmt.Errorf("making the canary cookie key: %w", err)
		}
	}
	seq, err := routing.Publish(ctx, d.s, cp.ID+"."+cp.Phase, cp.Namespace, events)
	return splitServices(events), seq, err
}

// splitServices names the services events split: those a canary judges.
func splitServices(events []store.RoutingEvent) []string {
	var out []string
	for _, ev := range events {
		if ev.Split != nil {
			out = append(out, ev.Service)
		}
	}
	return out
}

// holdCanary holds one step for hold, reading the gateways' counters and
// the operators' decisions every CanaryPoll. It returns the verdict (passed,
// aborted or promoted), why, and the figures it was reached on; an error
// when the hold was cut short (ctx, a lost lease) or the counters could
// not be read at its end.
//
// live is how many gateways serve the routing (judgeGateways). checkLease
// is asked each poll: a lost lease (another orchestrator, or the
// completer, may be deciding) ends the hold with its error.
func (d *Deployer) holdCanary(ctx context.Context, ns, deploy string, services []string, limits store.CanaryLimits, hold time.Duration,
	live int, checkLease func(context.Context) error) (store.CanaryVerdict, string, []store.CanaryFigures, error) {
	end := time.Now().Add(hold)
	t := time.NewTicker(CanaryPoll)
	defer t.Stop()
	var figs []store.CanaryFigures
	for {
		if err := checkLease(ctx); store.HasCode(err, store.CodeLeaseLost) {
			return "", "", figs, err
		}
		if dec, err := d.s.CanaryDecisionOf(ctx, ns, deploy); err == nil && dec != nil {
			if counts, err := d.canaryCounts(ctx, ns, deploy, services); err == nil {
				figs, _, _ = judgeGateways(counts, limits, true, 0)
			}
			return decisionVerdict(dec), decisionReason(dec), figs, nil
		}
		counts, err := d.canaryCounts(ctx, ns, deploy, services)
		final := !time.Now().Before(end)
		if err == nil {
			f, reason, breach := judgeGateways(counts, limits, final, live)
			figs = f
			if breach {
				return store.CanaryAborted, reason, figs, nil
			} else if final {
				return store.CanaryPassed, reason, figs, nil
			}
		} else if final {
			return "", "", figs, fmt.Errorf("reading the gateways' canary counters: %w", err)
		}
		select {
		case <-ctx.Done():
			return "", "", figs, ctx.Err()
		case <-t.C:
		}
	}
}

func decisionVerdict(dec *store.CanaryDecision) store.CanaryVerdict {
	if dec.Action == store.DecisionPromote {
		return store.CanaryPromoted
	}
	return store.CanaryAborted
}

func decisionReason(dec *store.CanaryDecision) string {
	by := dec.By
	if by == "" {
		by = "an operator"
	}
	return fmt.Sprintf("%s by %s at %s", map[string]string{store.DecisionPromote: "promoted", store.DecisionAbort: "aborted"}[dec.Action], by, dec.At.Format(time.RFC3339))
}

// canaryCounts reads, from every gateway reporting now, its counters of
// canary deploy of ns for each of services. Each report is used only
// under the gateway its key names (ListJSON checks the body against the
// key, and the key is the one the gateway's credentials may write).
func (d *Deployer) canaryCounts(ctx context.Context, ns, deploy string, services []string) ([]serviceCounts, error) {
	by := map[string]*serviceCounts{}
	out := make([]serviceCounts, 0, len(services))
	for _, svc := range slices.Sorted(slices.Values(services)) {
		out = append(out, serviceCounts{service: svc, gateways: map[string]*[2]store.RevisionCounts{}})
	}
	for i := range out {
		by[out[i].service] = &out[i]
	}
	err := d.s.ListGatewayTraffic(ctx, func(g *store.GatewayTraffic) error {
		if time.Since(g.At) >= store.GatewayObservationTTL {
			return nil
		}
		for i := range g.Services {
			t := &g.Services[i]
			sc := by[t.Service]
			if t.Namespace != ns || t.Canary == nil || t.Canary.Deploy != deploy || sc == nil {
				continue
			}
			c := sc.gateways[g.Gateway]
			if c == nil {
				c = new([2]store.RevisionCounts)
				sc.gateways[g.Gateway] = c
			}
			c[0].Revision, c[1].Revision = t.Canary.Old.Revision, t.Canary.New.Revision
			c[0].Add(&t.Canary.Old)
			c[1].Add(&t.Canary.New)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// judgeCanary weighs figs against limits. It reports a breach, and why,
// when some service's new revision exceeds a limit (before the end of the
// hold only once it served MinRequests); at the end (final) a new
// revision that served fewer than MinRequests is a breach too, since
// nothing was shown. Otherwise reason sums up what passed.
func judgeCanary(figs []store.CanaryFigures, limits store.CanaryLimits, final bool) (reason string, breach bool) {
	var ok []string
	for _, f := range figs {
		why, breach, judged := judgeFigures(f, limits, final)
		if breach {
			return why, true
		}
		if judged {
			ok = append(ok, why)
		}
	}
	if len(ok) == 0 {
		return "no service judged yet", false
	}
	return "within limits: " + strings.Join(ok, "; "), false
}

// judgeFigures weighs one service's figures against limits, as
// judgeCanary does: judged is false while the new revision served fewer
// than MinRequests before the end of the hold.
func judgeFigures(f store.CanaryFigures, limits store.CanaryLimits, final bool) (reason string, breach, judged bool) {
	limits = limits.WithDefaults()
	minReq := uint64(max(*limits.MinRequests, 0))
	n, o := f.New, f.Old
	if n.Requests < minReq {
		if final {
			return fmt.Sprintf("%s: only %d requests reached revision %d during the hold (min_requests %d)", f.Service, n.Requests, n.Revision, minReq), true, true
		}
		return "", false, false
	}
	if n.Requests == 0 {
		return fmt.Sprintf("%s: no requests", f.Service), false, true
	}
	if n.ErrorRatio-o.ErrorRatio > limits.Max5xxRatio {
		return fmt.Sprintf("%s: 5xx ratio of revision %d is %.2f%% (%d of %d) against %.2f%% (%d of %d) for revision %d; the limit is %.2f points above it",
			f.Service, n.Revision, 100*n.ErrorRatio, n.Errors, n.Requests, 100*o.ErrorRatio, o.Errors, o.Requests, o.Revision, 100*limits.Max5xxRatio), true, true
	}
	base := max(o.P99, store.P99Floor)
	if n.P99 > limits.MaxP99Ratio*base {
		return fmt.Sprintf("%s: p99 of revision %d is %s against %s for revision %d; the limit is %gx (at least %s)",
			f.Service, n.Revision, seconds(n.P99), seconds(o.P99), o.Revision, limits.MaxP99Ratio, seconds(store.P99Floor)), true, true
	}
	return fmt.Sprintf("%s: revision %d %d requests, 5xx %.2f%%, p99 %s; revision %d %d requests, 5xx %.2f%%, p99 %s",
		f.Service, n.Revision, n.Requests, 100*n.ErrorRatio, seconds(n.P99), o.Revision, o.Requests, 100*o.ErrorRatio, seconds(o.P99)), false, true
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}

// routeBack ends the canary of cp by routing ns as live routes it: an
// abort checkpoint commit (so every later derivation of ns's routing
// ignores the canary), then publishLive.
func (d *Deployer) routeBack(ctx context.Context, cp, live *store.DeployCommit) (uint64, error) {
	abort := *cp
	abort.Phase = fmt.Sprintf("canary-%d-abort", cp.Canary.Step)
	abort.Canary = &store.Canary{Step: cp.Canary.Step, Abort: true}
	if _, err := d.s.AppendCommit(ctx, &abort); err != nil {
		return 0, fmt.Errorf("recording the abort of canary %s: %w", cp.ID, err)
	}
	return d.publishLive(ctx, &abort, live)
}

// publishLive publishes the routing of live again after the canary abort
// commit (idempotently per abort): live's services as it routes them, and
// a removal of each service only the canary had. It waits for the
// gateways and returns the last routing sequence.
func (d *Deployer) publishLive(ctx context.Context, abort, live *store.DeployCommit) (uint64, error) {
	src, err := routing.SourceOf(ctx, d.s, abort.Namespace)
	if err != nil {
		return 0, err
	}
	seq, err := routing.Publish(ctx, d.s, abort.ID+"."+abort.Phase, abort.Namespace, routing.CommitEvents(live, abort, src))
	if err != nil {
		return 0, fmt.Errorf("routing %s back to revision %d: %w", abort.Namespace, live.Revision, err)
	}
	d.waitGateways(ctx, seq)
	return seq, nil
}

// canaryUnderWay returns the checkpoint commit of deploy st if it is
// routing a canary now (not aborted, not superseded by a final commit).
func (d *Deployer) canaryUnderWay(ctx context.Context, st *store.DeployStatus, live *store.DeployCommit) (*store.DeployCommit, error) {
	cp, err := d.latestCanaryOf(ctx, st, live)
	if err != nil || cp == nil || cp.Canary.Abort {
		return nil, err
	}
	return cp, nil
}

// latestCanaryOf returns the latest checkpoint commit of ns if it is a
// canary step (or abort) of deploy st after the live commit; else nil.
func (d *Deployer) latestCanaryOf(ctx context.Context, st *store.DeployStatus, live *store.DeployCommit) (*store.DeployCommit, error) {
	cp, err := d.s.LatestCheckpoint(ctx, st.Namespace)
	if err != nil || cp == nil {
		return nil, err
	}
	if cp.ID != st.DeployID || cp.Canary == nil || (live != nil && cp.Seq < live.Seq) {
		return nil, nil
	}
	return cp, nil
}

// finishCanary decides the canary cp whose orchestrator stopped: an
// operator's recorded decision first, else the limits on the figures the
// gateways counted so far (as at the end of a hold). Promoted, the final
// commit is appended and returned (the caller publishes and drains as for
// any committed deploy); aborted, ns is routed back and st records why,
// and the candidates are left for FinishNamespace to stop.
func (d *Deployer) finishCanary(ctx context.Context, st *store.DeployStatus, cp, live *store.DeployCommit) (*store.DeployCommit, error) {
	src, err := routing.SourceOf(ctx, d.s, cp.Namespace)
	if err != nil {
		return nil, err
	}
	services := splitServices(routing.CanaryEvents(cp, live, src))
	var limits store.CanaryLimits
	if cp.Manifest.Rollout != nil {
		limits = cp.Manifest.Rollout.Limits
	}
	counts, err := d.canaryCounts(ctx, st.Namespace, st.DeployID, services)
	if err != nil {
		return nil, err
	}
	figs, judged, breach := judgeGateways(counts, limits, true, 0)
	verdict, reason := store.CanaryPassed, ""
	dec, err := d.s.CanaryDecisionOf(ctx, st.Namespace, st.DeployID)
	if err != nil {
		return nil, err
	}
	if dec != nil {
		verdict, reason = decisionVerdict(dec), decisionReason(dec)
	} else if reason = judged; breach {
		verdict = store.CanaryAborted
	}
	reason += " (decided by the control plane after the orchestrator stopped)"
	if n := len(st.Canary); n > 0 && st.Canary[n-1].Verdict == store.CanaryHolding {
		cur := &st.Canary[n-1]
		cur.EndedAt, cur.Verdict, cur.Reason, cur.Judged = time.Now().UTC(), verdict, reason, figs
	}
	if verdict == store.CanaryAborted {
		if _, err := d.routeBack(ctx, cp, live); err != nil {
			return nil, err
		}
		st.State, st.Phase = store.DeployFailedAfterCheckpoint, StepCheckpoint.Name()
		st.Error = store.Errorf(CodeCanaryAborted, "canary step %d (%d%%) aborted: %s", cp.Canary.Step, cp.Canary.Weight, reason).
			With("step", fmt.Sprint(cp.Canary.Step)).With("deploy", st.DeployID)
		if err := d.putStatus(ctx, st); err != nil {
			return nil, err
		}
		for s := StepFinalCommit; s <= StepDrainOld; s++ {
			_ = d.putPhase(ctx, st.Namespace, st.DeployID, s, store.PhaseSkipped, "", 0)
		}
		_ = d.putPhase(ctx, st.Namespace, st.DeployID, StepCheckpoint, store.PhaseFailed, reason, 0)
		d.printf("aborted the canary of deploy %s of %s: %s", st.DeployID, st.Namespace, reason)
		return live, nil
	}
	final := *cp
	final.Kind, final.Phase, final.Canary = store.CommitFinal, "", nil
	final.CreatedAt = time.Now().UTC()
	seq, err := d.s.AppendCommit(ctx, &final)
	if err != nil {
		return nil, err
	}
	st.State, st.CommitSeq, st.Phase = store.DeployCommitted, seq, StepFinalCommit.Name()
	_ = d.putPhase(ctx, st.Namespace, st.DeployID, StepCheckpoint, store.PhaseDone, reason, 0)
	_ = d.putPhase(ctx, st.Namespace, st.DeployID, StepFinalCommit, store.PhaseDone, "commit "+final.ID, seq)
	d.printf("promoted the canary of deploy %s of %s: %s", st.DeployID, st.Namespace, reason)
	return &final, nil
}

// DecideCanary records an operator's decision (store.DecisionPromote or
// DecisionAbort) on the canary under way in ns, for the apply holding it
// or, if its orchestrator is gone, the control plane to act on. It
// returns the deploy's status.
func (d *Deployer) DecideCanary(ctx context.Context, ns, action string) (*store.DeployStatus, error) {
	sts, err := d.Statuses(ctx, ns)
	if err != nil {
		return nil, err
	}
	live, err := d.s.LiveCommit(ctx, ns)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	for i := len(sts) - 1; i >= 0; i-- {
		st := &sts[i]
		if st.State != store.DeployApplying {
			continue
		}
		cp, err := d.canaryUnderWay(ctx, st, live)
		if err != nil {
			return nil, err
		}
		if cp == nil {
			continue
		}
		if err := d.s.PutCanaryDecision(ctx, &store.CanaryDecision{Namespace: ns, DeployID: st.DeployID,
			Action: action, By: d.opts.Holder}); err != nil {
			return nil, err
		}
		return st, nil
	}
	return nil, store.Errorf(store.CodeNotFound, "namespace %s has no canary under way", ns).With("namespace", ns)
}
