package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// serviceRef names one service of one namespace.
type serviceRef struct{ namespace, service string }

// republishQueue is the set of services whose routing republish the control
// plane has not taken yet, kept in a file of the agent's data dir so that an
// agent restarted meanwhile still asks.
type republishQueue struct {
	path string

	mu      sync.Mutex // guards pending and the file's contents
	pending map[serviceRef]bool
}

// pendingRepublish is one entry of the queue's file.
type pendingRepublish struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
}

func newRepublishQueue(path string) *republishQueue {
	return &republishQueue{path: path, pending: map[serviceRef]bool{}}
}

// load adds what a previous agent had not got republished.
func (q *republishQueue) load() error {
	b, err := os.ReadFile(q.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var list []pendingRepublish
	if err == nil {
		err = json.Unmarshal(b, &list)
	}
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range list {
		q.pending[serviceRef{p.Namespace, p.Service}] = true
	}
	return nil
}

// set marks ref pending or not, writing the file when that changed.
func (q *republishQueue) set(ref serviceRef, pending bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pending[ref] == pending {
		return nil
	}
	if pending {
		q.pending[ref] = true
	} else {
		delete(q.pending, ref)
	}
	return q.save()
}

// list is what is pending now, in a stable order.
func (q *republishQueue) list() []serviceRef {
	q.mu.Lock()
	defer q.mu.Unlock()
	refs := make([]serviceRef, 0, len(q.pending))
	for ref := range q.pending {
		refs = append(refs, ref)
	}
	slices.SortFunc(refs, func(a, b serviceRef) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.service, b.service))
	})
	return refs
}

// save writes the pending set whole (replacing the file), or removes the
// file when nothing is pending; q.mu is held.
func (q *republishQueue) save() error {
	if len(q.pending) == 0 {
		if err := os.Remove(q.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	list := make([]pendingRepublish, 0, len(q.pending))
	for ref := range q.pending {
		list = append(list, pendingRepublish{ref.namespace, ref.service})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	tmp := q.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, q.path)
}

// requestRepublish asks the control plane to publish the service's routing
// again from stored state, so gateways see an instance's new status at
// once. A request the control plane did not take is queued and asked again
// by retryRepublish: a gateway would otherwise keep routing to an instance
// that left until its next rebuild. A namespace without a committed deploy,
// or a service this machine runs nothing of, has nothing to republish.
func (a *Agent) requestRepublish(ctx context.Context, ns, service string) error {
	_, err := a.cfg.Store.RequestRepublish(ctx, a.cfg.Machine.ID, ns, service)
	retry := false
	switch {
	case err == nil || store.HasCode(err, store.CodeNotFound):
		err = nil
	case store.HasCode(err, store.CodeRPCFailure), store.HasCode(err, store.CodeUnavailable),
		store.HasCode(err, store.CodeQuorumUnavailable), store.HasCode(err, store.CodeInternal):
		// The control plane or its store is away: worth asking again.
		retry = true
	default:
		// A refusal (invalid, say) stays one; asking again changes nothing.
	}
	if perr := a.republish.set(serviceRef{ns, service}, retry); perr != nil {
		a.log.Error("persisting pending routing republishes", zap.Error(perr))
	}
	if err != nil {
		return fmt.Errorf("republishing %s/%s: %w", ns, service, err)
	}
	return nil
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
		for _, ref := range a.republish.list() {
			if err := a.requestRepublish(ctx, ref.namespace, ref.service); err != nil {
				a.log.Warn("routing republish still not taken", zap.String("namespace", ref.namespace), zap.String("service", ref.service), zap.Error(err))
			} else {
				a.log.Info("routing republished after retry", zap.String("namespace", ref.namespace), zap.String("service", ref.service))
			}
		}
	}
}
