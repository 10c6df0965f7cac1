package deploy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// publish derives the routing events of commit, which replaced prev (nil
// for a namespace's first), from stored state and appends them, idempotently
// per commit, then records that on st.
func (d *Deployer) publish(ctx context.Context, st *store.DeployStatus, commit, prev *store.DeployCommit) error {
	src, err := routing.SourceOf(ctx, d.s, commit.Namespace)
	if err != nil {
		return err
	}
	seq, err := routing.Publish(ctx, d.s, commit.ID, commit.Namespace, routing.CommitEvents(commit, prev, src))
	if err != nil {
		return err
	}
	st.RoutingPublished, st.RoutingSeq = true, seq
	return d.putStatus(ctx, st)
}

// complete finishes what interrupted operations left in ns. The caller holds
// the namespace lease, so any other "applying" deploy has lost its
// orchestrator. A deploy whose final commit exists is committed, whatever
// its status says, and its routing events are published; one without is
// recorded as abandoned. Its candidates are leftovers the next plan (or
// settle) stops. live is the namespace's live commit as read under the
// lease (nil if none).
func (d *Deployer) complete(ctx context.Context, ns string, lease *store.Lease, live *store.DeployCommit) (*store.DeployCommit, error) {
	sts, err := d.Statuses(ctx, ns)
	if err != nil {
		return live, err
	}
	for i := range sts {
		st := &sts[i]
		if st.State == store.DeployApplying && (live == nil || live.ID != st.DeployID) {
			// A canary its orchestrator left: decided now, as its limits
			// (or an operator) say. Promoted, it is committed and goes on
			// below; aborted, it is failed after its checkpoint.
			cp, err := d.latestCanaryOf(ctx, st, live)
			if err != nil {
				return live, err
			}
			if cp != nil {
				if err := lease.Check(ctx); err != nil {
					return live, err
				}
				if cp.Canary.Abort {
					// Aborted, but maybe not yet routed back.
					if _, err := d.publishLive(ctx, cp, live); err != nil {
						return live, err
					}
					st.State = store.DeployFailedAfterCheckpoint
					if st.Error == nil {
						st.Error = store.Errorf(CodeCanaryAborted, "canary step %d aborted; its orchestrator stopped before recording why", cp.Canary.Step)
					}
					if err := d.putStatus(ctx, st); err != nil {
						return live, err
					}
					continue
				}
				next, err := d.finishCanary(ctx, st, cp, live)
				if err != nil {
					return live, fmt.Errorf("finishing the canary of deploy %s: %w", st.DeployID, err)
				}
				if next == live {
					continue
				}
				prev := live
				live = next
				st.Warnings = append(st.Warnings, "canary promoted by the control plane after the orchestrator stopped")
				if err := d.publish(ctx, st, live, prev); err != nil {
					return live, fmt.Errorf("completing promoted deploy %s: %w", st.DeployID, err)
				}
				continue
			}
		}
		switch {
		case st.State == store.DeployApplying && live != nil && live.ID == st.DeployID:
			// Crashed between the final commit and recording it.
			st.State, st.CommitSeq = store.DeployCommitted, live.Seq
			fallthrough
		case st.State == store.DeployCommitted && !st.RoutingPublished:
			if err := lease.Check(ctx); err != nil {
				return live, err
			}
			if live == nil || live.ID != st.DeployID {
				// A later commit superseded it and published its own events.
				st.RoutingPublished = true
				st.Warnings = append(st.Warnings, "routing events superseded by a later commit")
				if err := d.putStatus(ctx, st); err != nil {
					return live, err
				}
				continue
			}
			st.Warnings = append(st.Warnings, "routing events published by a later operation after the orchestrator stopped")
			var prev *store.DeployCommit
			if live.ReplacesSeq != 0 {
				if prev, err = d.s.CommitAt(ctx, live.ReplacesSeq); err != nil {
					return live, fmt.Errorf("completing committed deploy %s: %w", st.DeployID, err)
				}
			}
			if err := d.publish(ctx, st, live, prev); err != nil {
				return live, fmt.Errorf("completing committed deploy %s: %w", st.DeployID, err)
			}
			d.printf("completed committed deploy %s of %s: published its routing events (up to sequence %d)", st.DeployID, ns, st.RoutingSeq)
		case st.State == store.DeployApplying:
			if err := lease.Check(ctx); err != nil {
				return live, err
			}
			st.State = store.DeployFailed
			st.Error = store.Errorf(CodeAbandoned, "the orchestrator stopped during %s, before the final commit; nothing was routed", st.Phase).
				With("phase", st.Phase)
			if err := d.putStatus(ctx, st); err != nil {
				return live, err
			}
			d.printf("recorded deploy %s of %s as failed: its orchestrator stopped during %s before the final commit", st.DeployID, ns, st.Phase)
		}
	}
	return live, nil
}

// needsFinishing reports whether st is work for FinishNamespace: a deploy
// not settled, or one with instances it could not stop.
func needsFinishing(st *store.DeployStatus) bool {
	return !st.Settled || len(st.Cleanup) > 0
}

// FinishNamespace does, under the namespace lease lease, everything a
// deploy of ns left undone because its orchestrator stopped: it completes
// statuses and routing (complete), waits for gateways to serve the live
// commit, drains, and stops every instance of ns the live commit does not
// route (what it replaced, and candidates of failed deploys), retrying
// earlier cleanup failures; hosts the live commit no longer routes are
// released. It reports whether anything is left to retry (an instance on
// a machine that does not answer).
func (d *Deployer) FinishNamespace(ctx context.Context, ns string, lease *store.Lease) (retry bool, err error) {
	live, err := d.s.LiveCommit(ctx, ns)
	switch {
	case store.HasCode(err, store.CodeNotFound):
		live = nil
	case err != nil:
		return true, err
	}
	if live, err = d.complete(ctx, ns, lease, live); err != nil {
		return true, err
	}
	sts, err := d.Statuses(ctx, ns)
	if err != nil {
		return true, err
	}
	var open []*store.DeployStatus
	var liveSt *store.DeployStatus
	for i := range sts {
		st := &sts[i]
		if needsFinishing(st) {
			open = append(open, st)
		}
		if live != nil && st.DeployID == live.ID {
			liveSt = st
		}
	}
	if len(open) == 0 {
		return false, nil
	}
	insts, err := d.s.NamespaceInstances(ctx, ns)
	if err != nil {
		return true, err
	}
	keep := map[string]bool{}
	var routed hosts.Wanted
	if live != nil {
		for _, sl := range live.Slots {
			keep[sl.InstanceID] = true
		}
		routed = hosts.Of(&live.Manifest)
	}
	var strays []*store.InstanceRecord
	for _, in := range insts {
		if !keep[in.ID] {
			strays = append(strays, in)
		}
	}
	sort.Slice(strays, func(i, j int) bool { return strays[i].ID < strays[j].ID })

	// What the live commit replaced leaves only once gateways route around
	// it, as in the apply's own drain.
	if liveSt != nil && !liveSt.Settled && liveSt.RoutingPublished {
		serving, total, laggards := d.waitGateways(ctx, liveSt.RoutingSeq)
		liveSt.Gateways = fmt.Sprintf("%d/%d", serving, total)
		for _, g := range laggards {
			liveSt.Warnings = append(liveSt.Warnings, fmt.Sprintf("gateway %s has not applied routing sequence %d after %s", g, liveSt.RoutingSeq, d.opts.GatewayWait))
		}
		if len(strays) > 0 {
			// As in the apply's drain: layer-4 connections to the strays of
			// a service the live commit exposes below HTTP drain first (a
			// service the live commit dropped is not known here).
			stopping := map[string]string{}
			for _, in := range strays {
				stopping[in.ID] = in.Service
			}
			for _, w := range d.waitLayer4Drains(ctx, ns, liveSt.RoutingSeq, layer4Stops(stopping, &live.Manifest)) {
				liveSt.Warnings = append(liveSt.Warnings, "still draining at the drain timeout, stopped anyway: "+w)
			}
			if err := d.drainGrace(ctx); err != nil {
				return true, err
			}
		}
	}
	if err := lease.Check(ctx); err != nil {
		return true, err
	}
	failures := d.stopAll(ctx, ns, strays)

	// Each status keeps the failures of the instances it started or
	// replaced; the live one takes the rest.
	byDeploy := map[string]*store.DeployStatus{}
	for _, st := range open {
		st.Cleanup = nil
		byDeploy[st.DeployID] = st
	}
	for _, f := range failures {
		owner := liveSt
		if in := insts[f.InstanceID]; in != nil && byDeploy[in.DeployID] != nil && byDeploy[in.DeployID].State != store.DeployCommitted {
			owner = byDeploy[in.DeployID]
		}
		if owner == nil || !slices.Contains(open, owner) {
			owner = open[len(open)-1]
		}
		owner.Cleanup = append(owner.Cleanup, f)
	}
	if err := hosts.KeepOnly(ctx, d.s, ns, routed); err != nil {
		return true, fmt.Errorf("releasing hosts and ports %s no longer wants: %w", ns, err)
	}
	stale := false
	for _, st := range open {
		if st.State == store.DeployApplying {
			// complete has just decided every deploy left applying, so
			// this status was read from a replica behind that write
			// (reads are direct gets, which any replica answers): written
			// back settled, it would undo the decision and end as
			// applying for good. The next attempt reads it again.
			stale = true
			continue
		}
		wasSettled := st.Settled
		st.Settled = len(st.Cleanup) == 0
		if st.State == store.DeployCommitted && !wasSettled {
			st.Phase = StepDrainOld.Name()
			st.Warnings = append(st.Warnings, "finished by the control plane after its orchestrator stopped")
		}
		if err := d.putStatus(ctx, st); err != nil {
			return true, err
		}
		switch {
		case !st.Settled:
			d.printf("deploy %s of %s: %d instances still to stop, retrying: %s", st.DeployID, ns, len(st.Cleanup), cleanupSummary(st.Cleanup))
		case !wasSettled:
			d.printf("finished deploy %s of %s (%s)", st.DeployID, ns, st.State)
		}
	}
	if n := len(strays) - len(failures); n > 0 {
		d.printf("stopped %d instances of %s the live commit does not route", n, ns)
	}
	return len(failures) > 0 || stale, nil
}

func cleanupSummary(cs []store.CleanupFailure) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprintf("%s on %s (%s)", c.InstanceID, c.Machine, c.Error)
	}
	return strings.Join(out, "; ")
}

// stopAll stops and forgets insts on their machines, in parallel, and
// returns what could not be stopped. An instance whose machine is no
// longer a member (removed with `machine rm --force`) is forgotten
// without asking it.
func (d *Deployer) stopAll(ctx context.Context, ns string, insts []*store.InstanceRecord) []store.CleanupFailure {
	sctx, cancel := context.WithTimeout(ctx, d.opts.StopGrace+d.opts.RPCTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []store.CleanupFailure
	for _, in := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.s.Call(sctx, in.Machine, store.CmdStopInstance, store.InstanceRequest{
				InstanceID: in.ID, Namespace: ns, Grace: store.Duration(d.opts.StopGrace), Forget: true,
			}, nil)
			if err != nil && store.HasCode(err, store.CodeRPCFailure) {
				if _, _, gerr := d.s.GetMachine(sctx, in.Machine); store.HasCode(gerr, store.CodeNotFound) {
					err = d.s.DeleteInstance(sctx, in.Key())
				}
			}
			if err != nil {
				mu.Lock()
				out = append(out, store.CleanupFailure{InstanceID: in.ID, Machine: in.Machine, Error: err.Error()})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out
}

// CompleterOptions tune RunCompleter.
type CompleterOptions struct {
	// Interval between attempts on a namespace with work; default 1s.
	Interval time.Duration
	// RetryInterval between attempts on a namespace whose last attempt
	// left instances it could not stop (their machine did not answer);
	// default 5s.
	RetryInterval time.Duration
	// OnError is told of a failed attempt; it is retried.
	OnError func(ns string, err error)
}

// RunCompleter finishes, until ctx ends, every deploy whose orchestrator
// stopped before it was done: it watches deploy statuses and, for a
// namespace with one not settled, tries the namespace lease each Interval.
// While the orchestrator lives it holds that lease and this waits; once the
// lease is free (released, or expired with a dead holder) this runs
// FinishNamespace. Every control server runs one; the lease makes sure one
// at a time finishes a namespace.
func (d *Deployer) RunCompleter(ctx context.Context, o CompleterOptions) error {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = 5 * time.Second
	}
	w, err := d.s.WatchDeployStatus(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	// A lease that expires or is released is tried at once rather than at
	// the next tick.
	lw, err := d.s.WatchDeployLeases(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = lw.Stop() }()
	// open holds the status keys that need finishing, by namespace; next
	// when each namespace may be tried again.
	open := map[string]map[string]bool{}
	next := map[string]time.Time{}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	attempt := func(ns string, now time.Time) {
		retry, err := d.tryFinish(ctx, ns)
		switch {
		case store.HasCode(err, store.CodeBusy):
			// Its orchestrator is at work; the lease's expiry or
			// release brings us back.
		case err != nil:
			if ctx.Err() == nil && o.OnError != nil {
				o.OnError(ns, err)
			}
			next[ns] = now.Add(o.RetryInterval)
		case retry:
			next[ns] = now.Add(o.RetryInterval)
		default:
			// Settled: the statuses just written say so too, and the
			// watch will agree.
			delete(open, ns)
			delete(next, ns)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ent, ok := <-lw.Updates():
			if !ok {
				return store.Errorf(store.CodeUnavailable, "deploy lease watch ended")
			}
			if ent == nil || ent.Operation() == jetstream.KeyValuePut {
				continue
			}
			// A namespace lease expired or was released: if its
			// namespace has work, now is the time.
			ns := strings.TrimPrefix(ent.Key(), strings.TrimSuffix(store.DeployLocksFilter, "*"))
			if now := time.Now(); open[ns] != nil && !now.Before(next[ns]) {
				attempt(ns, now)
			}
		case ent, ok := <-w.Updates():
			if !ok {
				return store.Errorf(store.CodeUnavailable, "deploy status watch ended")
			}
			if ent == nil {
				continue
			}
			key := ent.Key()
			ns, _, _ := strings.Cut(key, ".")
			var st store.DeployStatus
			need := ent.Operation() == jetstream.KeyValuePut &&
				store.DecodeKeyed(d.s.Names.DeployStatusBucket(), key, ent.Value(), &st) == nil && needsFinishing(&st)
			if need {
				if open[ns] == nil {
					open[ns] = map[string]bool{}
				}
				open[ns][key] = true
			} else if open[ns] != nil {
				delete(open[ns], key)
				if len(open[ns]) == 0 {
					delete(open, ns)
					delete(next, ns)
				}
			}
		case <-t.C:
			now := time.Now()
			for _, ns := range slices.Sorted(maps.Keys(open)) {
				if !now.Before(next[ns]) {
					attempt(ns, now)
				}
			}
		}
	}
}

// completerPurpose names the completer in the leases it holds: an apply
// waits for such a holder rather than failing busy.
const completerPurpose = "finish deploys whose orchestrator stopped"

// tryFinish runs FinishNamespace if the namespace lease is free; a busy
// lease (an orchestrator at work) comes back as CodeBusy.
func (d *Deployer) tryFinish(ctx context.Context, ns string) (bool, error) {
	lease, err := d.s.AcquireLease(ctx, store.DeployLockKey(ns), store.LeaseOptions{
		TTL: d.opts.LeaseTTL, Holder: d.opts.Holder, Purpose: completerPurpose, KeepAlive: true,
	})
	if err != nil {
		return true, err
	}
	defer d.releaseLease(lease)
	return d.FinishNamespace(ctx, ns, lease)
}

// releaseLease gives back a deploy lease, waiting out a storage leader
// election for as long as the lease could otherwise block the next apply:
// given up after a fixed 5 s (an election after a storage node was
// killed can take longer), a release left the lease held until its TTL,
// and every apply started meanwhile failed busy at once.
func (d *Deployer) releaseLease(lease *store.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), max(5*time.Second, lease.TTL()))
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		fmt.Fprintf(d.opts.Out, "the deploy lease %s was not given back (%v): it is held until it expires, within %s\n",
			lease.Key(), err, lease.TTL())
	}
}
