package routing

import (
	"context"

	"github.com/edgeplane/edgeplane/store"
)

// Publish appends events, the routing of one namespace's commit, canary
// step or abort (every service the namespace routes, and a removal for each
// it dropped), as one routing batch (store.PublishRoutingBatch): a few
// messages under one seal, which a gateway applies in one view swap, and
// which a cold start takes as the namespace's whole state. While a live
// gateway runs a generation before store.GenerationBatches, or the
// gateways' reports cannot be read, it publishes one message per service
// as before (store.PublishRouting): older gateways would skip a batch as
// events they cannot read, so this is a fallback, not a refusal. msgID
// makes a retried publish idempotent.
func Publish(ctx context.Context, s *store.Store, msgID, ns string, events []store.RoutingEvent) (uint64, error) {
	if old, err := GatewaysBelow(ctx, s, store.GenerationBatches); err != nil || len(old) > 0 {
		return s.PublishRouting(ctx, msgID, events)
	}
	return s.PublishRoutingBatch(ctx, msgID, ns, events)
}

// CanaryBatch is every service namespace cp.Namespace routes during canary
// step cp over live: CanaryEvents, and each service only live has, as live
// routes it (what a republish of it publishes). A batch must hold them
// all: a cold start takes a namespace's newest batch as its whole state.
func CanaryBatch(cp, live *store.DeployCommit, src *Source) []store.RoutingEvent {
	out := CanaryEvents(cp, live, src)
	if live == nil {
		return out
	}
	for _, name := range servicesOnlyIn(live, cp) {
		out = append(out, ServiceUpsert(live, name, src))
	}
	return out
}
