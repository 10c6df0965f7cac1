package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// A gateway of a generation below the store's floor is refused at
// Provision, with the release the store needs; with no floor it loads.
func TestGatewayRefusesAStoreAboveItsGeneration(t *testing.T) {
	f := newFixture(t)
	storetest.FutureFloor(t, f.nats.Store, 99, "9.0.0")
	err := caddy.Load(f.config(), true)
	if err == nil {
		_ = caddy.Stop()
		t.Fatal("loaded a gateway on a store whose floor is generation 99")
	}
	if !strings.Contains(err.Error(), store.CodeTooOld) || !strings.Contains(err.Error(), "9.0.0") {
		t.Fatalf("loading on floor 99: %v, want too_old naming 9.0.0", err)
	}
}
