package storagenode_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// The fleet's rate-limit counts: a gateway publishes its own and hears
// every gateway's; it cannot publish another gateway's, and an agent can
// neither publish fake counts nor read them.
func TestRateCountsPermissions(t *testing.T) {
	_, auth, ns := startWithAuth(t)
	names, _ := store.NewNames("", "")
	connect := func(r storagenode.CredsRequest) (*nats.Conn, chan error) { return roleConn(t, ns, auth, r) }
	refused := func(violations chan error, what, subject string) {
		t.Helper()
		refusedPublish(t, violations, what, subject)
	}

	gw1, gw1Violations := connect(storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw1"})
	heard := make(chan string, 16)
	if _, err := gw1.Subscribe(names.RateCountsWildcard(), func(m *nats.Msg) { heard <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	if err := gw1.Flush(); err != nil {
		t.Fatal(err)
	}
	gw2, _ := connect(storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw2"})
	_ = gw1.Publish(names.RateCountsSubject("gw1"), []byte(`{"gateway":"gw1"}`))
	_ = gw2.Publish(names.RateCountsSubject("gw2"), []byte(`{"gateway":"gw2"}`))
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case s := <-heard:
			got[s] = true
		case v := <-gw1Violations:
			t.Fatalf("a gateway's own counts refused: %v", v)
		case <-time.After(5 * time.Second):
			t.Fatalf("gw1 heard only %v", got)
		}
	}
	if !got[names.RateCountsSubject("gw1")] || !got[names.RateCountsSubject("gw2")] {
		t.Fatalf("gw1 heard %v", got)
	}
	// gw1 speaking for gw2 would lower every gateway's budget for gw2's
	// clients, or raise it.
	_ = gw1.Publish(names.RateCountsSubject("gw2"), []byte(`{"gateway":"gw2"}`))
	refused(gw1Violations, "publish gw2's counts as gw1", names.RateCountsSubject("gw2"))

	agent, agentViolations := connect(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"})
	for _, gw := range []string{"gw1", "m1"} {
		_ = agent.Publish(names.RateCountsSubject(gw), []byte(`{"gateway":"`+gw+`"}`))
		refused(agentViolations, "publish counts as "+gw+" with an agent's credentials", names.RateCountsSubject(gw))
	}
	if _, err := agent.Subscribe(names.RateCountsWildcard(), func(*nats.Msg) {}); err == nil {
		refused(agentViolations, "read the fleet's counts with an agent's credentials", names.RateCountsWildcard())
	}
}
