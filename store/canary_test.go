package store_test

import (
	"context"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Only promote and abort are decisions; each is read back under its key.
func TestCanaryDecisions(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	if err := s.PutCanaryDecision(ctx, &store.CanaryDecision{Namespace: "shop", DeployID: "d2", Action: "maybe"}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("a decision that is none: %v", err)
	}
	if d, err := s.CanaryDecisionOf(ctx, "shop", "d2"); err != nil || d != nil {
		t.Fatalf("no decision yet: %v %v", d, err)
	}
	if err := s.PutCanaryDecision(ctx, &store.CanaryDecision{Namespace: "shop", DeployID: "d2", Action: store.DecisionAbort, By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.CanaryDecisionOf(ctx, "shop", "d2"); err != nil || d == nil || d.Action != store.DecisionAbort || d.By != "ops" {
		t.Fatalf("decision read back: %+v %v", d, err)
	}
}
