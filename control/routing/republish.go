package routing

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/edgeplane/edgeplane/store"
)

// Commits returns what ns routes now: its live final commit, and the
// checkpoint commit of a canary under way after it (nil when none is, or
// the latest was an abort). Both are verified.
func Commits(ctx context.Context, s *store.Store, ns string) (live, canary *store.DeployCommit, err error) {
	live, err = s.LiveCommit(ctx, ns)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		return nil, nil, err
	}
	cp, err := s.LatestCheckpoint(ctx, ns)
	if err != nil {
		return live, nil, err
	}
	if cp == nil || cp.Canary == nil || cp.Canary.Abort || (live != nil && cp.Seq < live.Seq) {
		return live, nil, nil
	}
	return live, cp, nil
}

// RepublishService publishes a fresh upsert of one service derived from the
// stored state, so an instance whose status changed (failure, drain) leaves
// or rejoins the pool at once. Agents ask for it through
// store.RequestRepublish, which ServeRepublish answers.
func RepublishService(ctx context.Context, s *store.Store, namespace, service string) (uint64, error) {
	return republish(ctx, s, namespace, service, nil)
}

// republish is RepublishService; check, when set, vets the namespace's
// instance records before anything is published.
func republish(ctx context.Context, s *store.Store, namespace, service string, check func(map[string]*store.InstanceRecord) error) (uint64, error) {
	live, canary, err := Commits(ctx, s, namespace)
	if err != nil {
		return 0, err
	}
	if live == nil && canary == nil {
		return 0, &store.Error{Code: store.CodeNotFound, Message: fmt.Sprintf("namespace %s has no committed deploy", namespace),
			Detail: map[string]string{"namespace": namespace}}
	}
	src, err := SourceOf(ctx, s, namespace)
	if err != nil {
		return 0, err
	}
	if check != nil {
		if err := check(src.Instances); err != nil {
			return 0, err
		}
	}
	// While a canary is under way its step says how the service is
	// routed; the live commit alone otherwise.
	if canary == nil {
		if _, ok := live.Manifest.Services[service]; !ok {
			return 0, nil
		}
		return s.PublishRouting(ctx, "", []store.RoutingEvent{ServiceUpsert(live, service, src)})
	}
	for _, ev := range CanaryEvents(canary, live, src) {
		if ev.Service == service {
			return s.PublishRouting(ctx, "", []store.RoutingEvent{ev})
		}
	}
	// A service the canary removes is routed as live routes it until the
	// final commit.
	if live != nil {
		if _, ok := live.Manifest.Services[service]; ok {
			return s.PublishRouting(ctx, "", []store.RoutingEvent{ServiceUpsert(live, service, src)})
		}
	}
	return 0, nil
}

// ServeRepublish answers store.RequestRepublish for every machine, on s's
// connection, until ctx ends or the returned stop is called. A machine may
// only ask about a service it runs (or ran) an instance of; what gets
// published is derived from stored state alone, never from the request.
func ServeRepublish(ctx context.Context, s *store.Store) (func(), error) {
	return store.Serve(ctx, s.NC, s.Names.RoutingRepublishWildcard(), "control.republish", "republish",
		func(ctx context.Context, machine string, data []byte) (any, error) {
			var req store.RepublishRequest
			if err := json.Unmarshal(data, &req); err != nil {
				return nil, store.Errorf(store.CodeInvalid, "decoding republish request: %w", err)
			}
			for what, tok := range map[string]string{"machine": machine, "namespace": req.Namespace, "service": req.Service} {
				if !store.ValidToken(tok) {
					return nil, store.Errorf(store.CodeInvalid, "republish request: invalid %s %q", what, tok).With("field", what)
				}
			}
			seq, err := republish(ctx, s, req.Namespace, req.Service, func(insts map[string]*store.InstanceRecord) error {
				for _, in := range insts {
					if in.Machine == machine && in.Service == req.Service {
						return nil
					}
				}
				return store.Errorf(store.CodeNotFound, "machine %s has no instance of %s/%s", machine, req.Namespace, req.Service).
					With("machine", machine).With("namespace", req.Namespace).With("service", req.Service)
			})
			if err != nil {
				return nil, err
			}
			return store.RepublishReply{Seq: seq}, nil
		})
}
