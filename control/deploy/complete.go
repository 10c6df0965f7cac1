package deploy

import (
	"context"
	"fmt"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// publish derives the routing events of commit, which replaced prev (nil
// for a namespace's first), from stored state and appends them, idempotently
// per commit, then records that on st.
func (d *Deployer) publish(ctx context.Context, st *store.DeployStatus, commit, prev *store.DeployCommit) error {
	insts, err := d.s.NamespaceInstances(ctx, commit.Namespace)
	if err != nil {
		return err
	}
	seq, err := d.s.PublishRouting(ctx, commit.ID, store.CommitEvents(commit, prev, insts))
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
// recorded as abandoned. Its candidates are leftovers the next plan stops.
// live is the namespace's live commit as read under the lease (nil if none).
func (d *Deployer) complete(ctx context.Context, ns string, lease *store.Lease, live *store.DeployCommit) error {
	sts, err := d.Statuses(ctx, ns)
	if err != nil {
		return err
	}
	for i := range sts {
		st := &sts[i]
		switch {
		case st.State == store.DeployApplying && live != nil && live.ID == st.DeployID:
			// Crashed between the final commit and recording it.
			st.State, st.CommitSeq = store.DeployCommitted, live.Seq
			fallthrough
		case st.State == store.DeployCommitted && !st.RoutingPublished:
			if err := lease.Check(ctx); err != nil {
				return err
			}
			if live == nil || live.ID != st.DeployID {
				// A later commit superseded it and published its own events.
				st.RoutingPublished = true
				st.Warnings = append(st.Warnings, "routing events superseded by a later commit")
				if err := d.putStatus(ctx, st); err != nil {
					return err
				}
				continue
			}
			st.Warnings = append(st.Warnings, "routing events published by a later operation after the orchestrator stopped")
			var prev *store.DeployCommit
			if live.ReplacesSeq != 0 {
				if prev, err = d.s.CommitAt(ctx, live.ReplacesSeq); err != nil {
					return fmt.Errorf("completing committed deploy %s: %w", st.DeployID, err)
				}
			}
			if err := d.publish(ctx, st, live, prev); err != nil {
				return fmt.Errorf("completing committed deploy %s: %w", st.DeployID, err)
			}
			d.printf("completed committed deploy %s of %s: published its routing events (up to sequence %d)", st.DeployID, ns, st.RoutingSeq)
		case st.State == store.DeployApplying:
			if err := lease.Check(ctx); err != nil {
				return err
			}
			st.State = store.DeployFailed
			st.Error = store.Errorf("abandoned", "the orchestrator stopped during %s, before the final commit; nothing was routed", st.Phase).
				With("phase", st.Phase)
			if err := d.putStatus(ctx, st); err != nil {
				return err
			}
			d.printf("recorded deploy %s of %s as failed: its orchestrator stopped during %s before the final commit", st.DeployID, ns, st.Phase)
		}
	}
	return nil
}

// CompleteAll runs complete for every namespace, as `control server` does
// at start, saying what it did on Out. A namespace whose lease is held is
// waited for until ctx ends: either a live apply finishes (and completes the
// namespace itself) or a dead holder's lease expires.
func (d *Deployer) CompleteAll(ctx context.Context) error {
	nss, err := d.Namespaces(ctx)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		var lease *store.Lease
		for {
			lease, err = d.s.AcquireLease(ctx, store.DeployLockKey(ns), store.LeaseOptions{
				TTL: d.opts.LeaseTTL, Holder: d.opts.Holder, Purpose: "complete interrupted deploys",
			})
			if !store.HasCode(err, store.CodeBusy) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("completing %s: lease still held: %w", ns, err)
			case <-time.After(250 * time.Millisecond):
			}
		}
		if err != nil {
			return err
		}
		live, err := d.s.LiveCommit(ctx, ns)
		if store.HasCode(err, store.CodeNotFound) {
			live, err = nil, nil
		}
		if err == nil {
			err = d.complete(ctx, ns, lease, live)
		}
		_ = lease.Release(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}
