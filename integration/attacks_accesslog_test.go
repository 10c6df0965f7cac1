package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
)

// 22. Access lines are bound to the gateway that publishes them: a
// gateway's credentials publish on its own access subjects only (and the
// control account, across the edge account's export, receives them and
// keeps them in the access-log stream); they cannot pose as another
// gateway, and neither a gateway nor an agent reads anyone's lines or
// publishes any as an agent.
func attackAccessLines(t *testing.T, f *attackFixture) {
	n := f.c.store.Names
	got := make(chan *nats.Msg, 64)
	sub, err := f.c.store.NC.ChanSubscribe(n.AccessLogsWildcard(), got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.c.store.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	line := func(gw, id string) []byte {
		b, _ := json.Marshal(store.AccessLine{At: time.Now().UTC(), Gateway: gw, Namespace: "shop", Service: "web", Method: "GET",
			Host: "shop.example.com", Path: "/", Status: 200, RequestID: id, Sample: 1})
		return b
	}
	gw := f.as(t, f.gwCreds) // bound to gw1
	agent := f.as(t, f.agentCreds)

	// Its own subject: received by the control account.
	own := n.AccessSubject("shop", "web", "gw1")
	if err := gw.nc.Publish(own, line("gw1", "own-line")); err != nil {
		t.Fatal(err)
	}
	if err := gw.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Subject != own {
			t.Fatalf("the control account got %s, want %s", m.Subject, own)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("gateway gw1's own access line did not reach the control account")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eventually(t, 5*time.Second, "the access-log stream to keep gw1's line", func() bool {
		str, err := f.c.store.JS.Stream(ctx, n.AccessLogsStream())
		if err != nil {
			return false
		}
		info, err := str.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})

	// publishOrWait publishes and then waits for the server's refusal,
	// which comes without an answer; one that never comes is an
	// acceptance.
	publishOrWait := func(th *thief, subject, id string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			if err := th.nc.Publish(subject, line("gw1", id)); err != nil {
				return err
			}
			if err := th.nc.Flush(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			return nil
		}
	}
	subscribeOrWait := func(th *thief, subject string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			s, err := th.nc.SubscribeSync(subject)
			if err != nil {
				return err
			}
			defer s.Unsubscribe()
			if err := th.nc.Flush(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			return nil
		}
	}
	gw.try(t, "gateway gw1 publishes gw2's access lines", publishOrWait(gw, n.AccessSubject("shop", "web", "gw2"), "forged-gw2"))
	agent.try(t, "an agent publishes access lines", publishOrWait(agent, own, "forged-agent"))
	gw.try(t, "gateway gw1 reads access lines", subscribeOrWait(gw, n.AccessWildcard("shop", "")))
	agent.try(t, "an agent reads access lines", subscribeOrWait(agent, n.AccessWildcard("shop", "web")))
	// None of the refused lines arrived.
	for {
		select {
		case m := <-got:
			var l store.AccessLine
			_ = json.Unmarshal(m.Data, &l)
			if l.RequestID == "forged-gw2" || l.RequestID == "forged-agent" {
				t.Fatalf("a refused access line arrived on %s: %s", m.Subject, m.Data)
			}
		case <-time.After(500 * time.Millisecond):
			return
		}
	}
}
