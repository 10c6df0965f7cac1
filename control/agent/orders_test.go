package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The agent runs, stops, drains and upgrades only on an order a certified,
// active signer made for this machine and command, fresh, and once: every
// other request is refused with order_refused and its reason, before
// anything runs. The would-be instances create a marker file first thing,
// so "nothing ran" is checked on the box, not only in the reply.
func TestAgentActsOnlyOnSignedOrders(t *testing.T) {
	srv := storetest.Start(t)
	dir := t.TempDir()
	f := startAgent(t, srv, dir)
	ctx := context.Background()
	names := srv.Store.Names
	nc := srv.Conn(t) // a bare connection: what control credentials give
	marks := t.TempDir()
	startOf := func(name string) (string, store.StartRequest) {
		m := filepath.Join(marks, name)
		return m, store.StartRequest{
			Instance: store.InstanceRecord{ID: "web-" + name, Namespace: "shop", Service: "web", Revision: 1, DeployID: "d1"},
			Spec:     store.ServiceSpec{Command: []string{"sh", "-c", "touch " + m + " && exec sleep 60"}},
		}
	}
	startSubject := names.RPCSubject("m1", store.CmdStartCandidate)
	// The signature does not cover what would make a refusal pass (a
	// copy taken off the wire is sent again by hand).
	send := func(subject string, body []byte, h nats.Header) error {
		t.Helper()
		msg, err := nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: body}, 5*time.Second)
		if err != nil {
			t.Fatalf("request on %s: %v", subject, err)
		}
		var rep struct {
			Error *store.Error `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Error != nil {
			return rep.Error
		}
		return nil
	}
	ran := func(marker string) bool {
		_, err := os.Stat(marker)
		return err == nil
	}
	refused := func(what string, err error, reason, marker string) {
		t.Helper()
		if !store.HasCode(err, store.CodeOrderRefused) || store.AsError(err).Detail["reason"] != reason {
			t.Fatalf("%s: want order_refused (%s), got %v", what, reason, err)
		}
		if marker != "" && ran(marker) {
			t.Fatalf("%s: refused, but its command ran", what)
		}
		t.Logf("%s: %v", what, err)
	}
	signed := func(k *signing.Key, o store.Order, req any) ([]byte, nats.Header) {
		t.Helper()
		body, h, err := names.SignOrder(k, o, req)
		if err != nil {
			t.Fatal(err)
		}
		return body, h
	}
	order := func(machine, command string, at time.Time) store.Order {
		t.Helper()
		o, err := store.NewOrder(machine, command, at)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}

	// A genuine order runs, and a copy taken off the wire is kept.
	spy, err := nc.SubscribeSync(startSubject)
	if err != nil {
		t.Fatal(err)
	}
	// The subscription reaches the server before the order does.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	okMarker, okReq := startOf("genuine")
	var rep store.StartReply
	if err := srv.Store.Call(ctx, "m1", store.CmdStartCandidate, okReq, &rep); err != nil {
		t.Fatalf("a genuine signed order: %v", err)
	}
	storetest.Eventually(t, 5*time.Second, "the genuine order's command to run", func() bool { return ran(okMarker) })
	copied, err := spy.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = spy.Unsubscribe()
	want := f.agent.count()

	// Unsigned, as control credentials alone can send it.
	m, req := startOf("unsigned")
	refused("an unsigned start", store.Call(ctx, nc, startSubject, "m1", store.CmdStartCandidate, req, nil), signing.ReasonUnsigned, m)

	// Signed by a key the trust root never certified.
	rogue, err := signing.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	m, req = startOf("rogue")
	refused("an empty request", send(startSubject, nil, nil), signing.ReasonUnsigned, "")
	body, h := signed(rogue, order("m1", store.CmdStartCandidate, time.Now()), req)
	refused("a start signed by an uncertified key", send(startSubject, body, h), signing.ReasonUnknown, m)

	// Signed for another machine, sent to this one.
	key, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	m, req = startOf("m2")
	body, h = signed(key, order("m2", store.CmdStartCandidate, time.Now()), req)
	refused("a start signed for m2", send(startSubject, body, h), store.OrderWrongMachine, m)
	// Or for another command of this machine.
	body, h = signed(key, order("m1", store.CmdReadiness, time.Now()), req)
	refused("an order for another command", send(startSubject, body, h), store.OrderWrongMachine, m)

	// Stale: expired, or issued in this machine's future.
	m, req = startOf("stale")
	body, h = signed(key, order("m1", store.CmdStartCandidate, time.Now().Add(-store.OrderLifetime-store.OrderClockSkew-time.Minute)), req)
	refused("an expired start", send(startSubject, body, h), store.OrderStale, m)
	body, h = signed(key, order("m1", store.CmdStartCandidate, time.Now().Add(store.OrderClockSkew+time.Minute)), req)
	refused("a start from the future", send(startSubject, body, h), store.OrderStale, m)
	long := order("m1", store.CmdStartCandidate, time.Now())
	long.NotAfter = long.IssuedAt.Add(24 * time.Hour)
	body, h = signed(key, long, req)
	refused("a start good for a day", send(startSubject, body, h), store.OrderStale, m)

	// The spec changed after signing: another command in the same order.
	m, req = startOf("changed")
	body, h = signed(key, order("m1", store.CmdStartCandidate, time.Now()), req)
	evil := filepath.Join(marks, "evil")
	changed := bytes.Replace(body, []byte(m), []byte(evil), 1)
	if bytes.Equal(changed, body) {
		t.Fatal("the test did not change the spec")
	}
	refused("a start whose spec changed after signing", send(startSubject, changed, h), signing.ReasonBadSignature, evil)
	// The same order as signed runs (and only once: below).
	if err := send(startSubject, body, h); err != nil || !waitRan(t, m) {
		t.Fatalf("the order as signed: %v", err)
	}
	want++

	// Replayed: the copy taken off the wire carries the genuine call's
	// ID, so it is an ask of that call (a caller asks again when an answer
	// is lost): answered as the call was, and run no more (the count
	// below). Without the call ID, and the order just run: refused.
	if err := send(startSubject, copied.Data, copied.Header); err != nil {
		t.Fatalf("the copy off the wire, an ask of the genuine call: %v", err)
	}
	stripped := nats.Header{}
	for k, v := range copied.Header {
		if k != store.CallIDHeader {
			stripped[k] = v
		}
	}
	refused("a replayed start", send(startSubject, copied.Data, stripped), store.OrderReplayed, "")
	refused("a replayed start", send(startSubject, body, h), store.OrderReplayed, "")

	// Stop, drain and upgrade (a downgrade) without a signature: the
	// genuine instance keeps running.
	for _, c := range []struct {
		command string
		req     any
	}{
		{store.CmdStopInstance, store.InstanceRequest{InstanceID: rep.Instance.ID, Namespace: "shop", Forget: true}},
		{store.CmdDrainInstance, store.InstanceRequest{InstanceID: rep.Instance.ID, Namespace: "shop"}},
		{store.CmdStop, store.LeasedCommand{InstanceID: rep.Instance.ID, Namespace: "shop", Service: "web", Attempt: int(time.Now().UnixMilli())}},
		{store.CmdRestart, store.LeasedCommand{InstanceID: rep.Instance.ID, Namespace: "shop", Service: "web", Attempt: int(time.Now().UnixMilli())}},
		{store.CmdForceCleanup, store.LeasedCommand{Namespace: "shop", Service: "web", Attempt: int(time.Now().UnixMilli())}},
		{store.CmdUpgrade, store.UpgradeRequest{Release: "0.0.1", Attempt: int(time.Now().UnixMilli()), AllowDowngrade: true}},
	} {
		err := store.Call(ctx, nc, names.RPCSubject("m1", c.command), "m1", c.command, c.req, nil)
		refused("an unsigned "+c.command, err, signing.ReasonUnsigned, "")
	}
	if inst, ok := f.agent.lookup(rep.Instance.ID); !ok || !running(inst.handle) {
		t.Fatal("the genuine instance stopped")
	}

	// A signer the root certified runs orders until it is retired.
	root, err := signing.LoadRoot(srv.AuthDir())
	if err != nil || root == nil {
		t.Fatalf("trust root: %v", err)
	}
	ops, err := signers.Issue(ctx, srv.Store, root, "ops", filepath.Join(t.TempDir(), "ops.nk"))
	if err != nil {
		t.Fatal(err)
	}
	m, req = startOf("ops")
	body, h = signed(ops, order("m1", store.CmdStartCandidate, time.Now()), req)
	if err := send(startSubject, body, h); err != nil || !waitRan(t, m) {
		t.Fatalf("an order of a certified CLI signer: %v", err)
	}
	want++
	if _, err := signers.Retire(ctx, srv.Store, root, ops.PublicKey()); err != nil {
		t.Fatal(err)
	}
	m, req = startOf("retired")
	body, h = signed(ops, order("m1", store.CmdStartCandidate, time.Now()), req)
	refused("a start signed by a retired signer", send(startSubject, body, h), signing.ReasonRetired, m)

	if n := f.agent.count(); n != want {
		t.Fatalf("the agent runs %d instances, want %d", n, want)
	}

	// A restarted agent still knows the orders it took.
	f.stop()
	<-f.done
	f = startAgentAlone(t, srv, dir)
	refused("a start replayed after the agent restarted", send(startSubject, copied.Data, copied.Header), store.OrderReplayed, "")

	// Genuine stops run.
	for _, name := range []string{"genuine", "changed", "ops"} {
		if err := srv.Store.Call(ctx, "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: "web-" + name, Namespace: "shop", Forget: true}, nil); err != nil {
			t.Fatalf("a genuine signed stop of web-%s: %v", name, err)
		}
	}
	if n := f.agent.count(); n != 0 {
		t.Fatalf("the agent runs %d instances after stopping them all", n)
	}
}

// waitRan waits for an instance's marker file.
func waitRan(t *testing.T, marker string) bool {
	t.Helper()
	storetest.Eventually(t, 5*time.Second, "the order's command to run", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	return true
}

// A caller without a signing key is told so before anything is sent.
func TestOrderWithoutSigningKey(t *testing.T) {
	srv := storetest.Start(t)
	startAgent(t, srv, t.TempDir())
	nc := srv.Conn(t)
	s, err := store.Open(context.Background(), nc, srv.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Call(context.Background(), "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: "x", Namespace: "shop"}, nil)
	if !store.HasCode(err, store.CodeSigningKeyRequired) {
		t.Fatalf("want signing_key_required, got %v", err)
	}
	// Reads need none.
	if err := s.Call(context.Background(), "m1", store.CmdCapacity, store.CapacityRequest{}, nil); err != nil {
		t.Fatal(err)
	}
}
