package agent

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// leased runs a leased command (restart, stop, forced cleanup). Its
// attempt number guards the generation: an attempt older than the newest
// seen for the same instance (or service, for a cleanup) is refused as
// stale, so a slow or retried older command never undoes a newer one.
func (a *Agent) leased(ctx context.Context, command string, req store.LeasedCommand) (*store.LeasedReply, error) {
	guard := req.InstanceID
	if command == store.CmdForceCleanup {
		guard = "service:" + req.Namespace + "/" + req.Service
	}
	if last, ok := a.takeAttempt(guard, req.Attempt); !ok {
		return nil, store.Errorf(store.CodeStale, "attempt %d of %s is older than attempt %d", req.Attempt, command, last).
			With("attempt", strconv.Itoa(req.Attempt)).With("newest", strconv.Itoa(last))
	}

	reply := &store.LeasedReply{Attempt: req.Attempt}
	switch command {
	case store.CmdStop:
		if err := a.stop(ctx, store.InstanceRequest{InstanceID: req.InstanceID, Namespace: req.Namespace, Grace: req.Grace}); err != nil {
			return nil, err
		}
		if err := a.requestRepublish(ctx, req.Namespace, req.Service); err != nil {
			return nil, err
		}
		reply.Detail = "stopped"
	case store.CmdRestart:
		if err := a.restartInPlace(ctx, req); err != nil {
			return nil, err
		}
		reply.Detail = "restarted"
	case store.CmdForceCleanup:
		ids := a.instancesOf(req.Namespace, req.Service)
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

// takeAttempt records attempt as the newest of guard, unless a newer one
// was seen (returned).
func (a *Agent) takeAttempt(guard string, attempt int) (newest int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last := a.attempts[guard]; attempt < last {
		return last, false
	}
	a.attempts[guard] = attempt
	return attempt, true
}

// restartInPlace drains, stops and starts the instance again with the same
// identity and address, and waits until it is ready and routed again.
func (a *Agent) restartInPlace(ctx context.Context, req store.LeasedCommand) error {
	inst, ok := a.lookup(req.InstanceID)
	if !ok {
		return a.notHere(req.InstanceID)
	}
	rec, spec := a.record(inst), inst.Spec
	if err := a.drain(ctx, rec.ID); err != nil {
		return err
	}
	if err := a.stop(ctx, store.InstanceRequest{InstanceID: rec.ID, Namespace: rec.Namespace, Grace: req.Grace}); err != nil {
		return err
	}
	spec.Port = rec.Port // keep the address the commit routes to
	if _, err := a.start(ctx, store.StartRequest{Instance: rec, Spec: spec}); err != nil {
		return err
	}
	rr, err := a.readiness(ctx, store.ReadinessRequest{InstanceID: rec.ID, Namespace: rec.Namespace})
	if err != nil {
		return err
	}
	if !rr.Ready {
		return store.Errorf(store.CodeUnavailable, "restarted instance %s is not ready: %s", rec.ID, rr.Error)
	}
	return a.requestRepublish(ctx, rec.Namespace, rec.Service)
}

// instancesOf lists the IDs of the service's instances the agent runs.
func (a *Agent) instancesOf(namespace, service string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, inst := range a.instances {
		if inst.Record.Namespace == namespace && inst.Record.Service == service {
			ids = append(ids, id)
		}
	}
	return ids
}
