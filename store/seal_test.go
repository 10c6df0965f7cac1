package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// upserts returns n service upserts of namespace ns.
func upserts(ns string, n int) []store.RoutingEvent {
	evs := make([]store.RoutingEvent, n)
	for i := range evs {
		evs[i] = store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: ns, Service: fmt.Sprintf("s%d", i),
			Endpoints: []store.Endpoint{{InstanceID: fmt.Sprintf("i%d", i), Address: "10.0.0.1", Port: 8000 + i}}}
	}
	return evs
}

// readStream reads the routing stream from seq on.
func readStream(t *testing.T, ctx context.Context, s *store.Store, seq uint64) []*store.StoredMsg {
	t.Helper()
	var msgs []*store.StoredMsg
	if _, err := s.ReadFrom(ctx, s.Names.RoutingEventsStream(), seq, "", func(m *store.StoredMsg) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// unsigned returns a copy of m without its own signature: what only a seal
// can vouch for.
func unsigned(m *store.StoredMsg) *store.StoredMsg {
	c := *m
	c.Header = nats.Header{}
	return &c
}

// PublishRouting files a seal before each batch of up to SealMax events,
// and a follower of the stream accepts every event of a batch by its
// digest: even stripped of its own signature. Without the seal, the same
// stripped events are refused as unsigned.
func TestPublishRoutingSealsBatches(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	info, _ := sRouting.Info(ctx)
	base := info.State.LastSeq
	evs := upserts("sealed", store.SealMax*2+7)
	last, err := s.PublishRouting(ctx, "batch1", evs)
	if err != nil {
		t.Fatal(err)
	}
	// Three seals, then the events in order.
	if want := base + uint64(len(evs)) + 3; last != want {
		t.Fatalf("last sequence %d, want %d", last, want)
	}
	msgs := readStream(t, ctx, s, base+1)
	var seals, stripped []*store.StoredMsg
	for _, m := range msgs {
		if s.IsSeal(m) {
			seals = append(seals, m)
			stripped = append(stripped, m)
			continue
		}
		stripped = append(stripped, unsigned(m))
	}
	if len(seals) != 3 || seals[0].Seq != base+1 || seals[1].Seq != base+2+store.SealMax || seals[2].Seq != base+3+2*store.SealMax {
		t.Fatalf("seals at %v", seqsOf(seals))
	}
	for i, ev := range verifyAll(t, ctx, s, stripped) {
		if ev.Service != evs[i].Service || ev.Seq != evs[i].Seq {
			t.Fatalf("event %d: %s at %d, published %s at %d", i, ev.Service, ev.Seq, evs[i].Service, evs[i].Seq)
		}
	}
	// The same run read in two parts: the seal in force carries over.
	var seal *store.Seal
	_, _, errs1 := s.VerifyRouting(ctx, stripped[:100], &seal)
	_, _, errs2 := s.VerifyRouting(ctx, stripped[100:], &seal)
	for i, err := range append(errs1, errs2...) {
		if err != nil {
			t.Fatalf("message %d read in two parts: %v", i, err)
		}
	}
	// Without their seals, stripped events are unsigned.
	var bare []*store.StoredMsg
	for _, m := range stripped {
		if !s.IsSeal(m) {
			bare = append(bare, m)
		}
	}
	seal = nil
	_, _, errs := s.VerifyRouting(ctx, bare[:3], &seal)
	for _, err := range errs {
		if store.AsError(err).Detail["reason"] != signing.ReasonUnsigned {
			t.Fatalf("an unsealed, unsigned event: %v", err)
		}
	}
	// A cold start verifies each event's own signature and reads no seal.
	rs, err := s.LoadRouting(ctx)
	if err != nil || len(rs.Services) != len(evs) || len(rs.Skipped) != 0 {
		t.Fatalf("load: %d services, skipped %v, %v", len(rs.Services), rs.Skipped, err)
	}
	// A single event needs no seal.
	if last, err = s.PublishRouting(ctx, "one", upserts("single", 1)); err != nil {
		t.Fatal(err)
	}
	if m := readStream(t, ctx, s, last-1); len(m) != 2 || s.IsSeal(m[0]) || s.IsSeal(m[1]) {
		t.Fatalf("a single event was sealed: %v", seqsOf(m))
	}
}

// verifyAll verifies msgs as a follower of the stream does, fails t on
// any refusal, and returns the events among them.
func verifyAll(t *testing.T, ctx context.Context, s *store.Store, msgs []*store.StoredMsg) []store.RoutingEvent {
	t.Helper()
	var seal *store.Seal
	events, _, errs := s.VerifyRouting(ctx, msgs, &seal)
	var out []store.RoutingEvent
	for i, m := range msgs {
		if errs[i] != nil {
			t.Fatalf("message %d on %s: %v", m.Seq, m.Subject, errs[i])
		}
		if !s.IsSeal(m) {
			if events[i].Seq != m.Seq {
				t.Fatalf("event %d decoded as %d", m.Seq, events[i].Seq)
			}
			out = append(out, events[i])
		}
	}
	if seal != nil {
		t.Fatal("a spent seal is still in force after its last event")
	}
	return out
}

func seqsOf(msgs []*store.StoredMsg) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Seq
	}
	return out
}

// What a seal does not vouch for is verified by its own signature: an
// event whose body differs from the sealed one, a seal signed by a
// stranger, a seal that claims events not right after it, a valid seal
// copied to another place.
func TestSealVouchesOnlyForWhatWasSealed(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	if _, err := s.PublishRouting(ctx, "b", upserts("shop", 4)); err != nil {
		t.Fatal(err)
	}
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	info, _ := sRouting.Info(ctx)
	msgs := readStream(t, ctx, s, info.State.LastSeq-4)
	if len(msgs) != 5 || !s.IsSeal(msgs[0]) {
		t.Fatalf("stream holds %v", seqsOf(msgs))
	}
	sealMsg := msgs[0]

	// Another body at a sealed place: not the sealed event, and its
	// signature does not verify either.
	tampered := *msgs[2]
	tampered.Data = []byte(`{"version":1,"kind":"service_upsert","namespace":"shop","service":"s1","endpoints":[{"instance_id":"evil","address":"203.0.113.9","port":80}]}`)
	var seal *store.Seal
	_, _, errs := s.VerifyRouting(ctx, []*store.StoredMsg{sealMsg, msgs[1], &tampered, msgs[3]}, &seal)
	if errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("sealed events refused: %v", errs)
	}
	if store.AsError(errs[2]).Detail["reason"] != signing.ReasonBadSignature {
		t.Fatalf("a tampered sealed event: %v", errs[2])
	}

	var rs store.RoutingSeal
	if err := json.Unmarshal(sealMsg.Data, &rs); err != nil {
		t.Fatal(err)
	}
	stranger, _ := signing.NewSigner()
	key, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	resign := func(k *signing.Key, seq uint64, rs store.RoutingSeal) *store.StoredMsg {
		data, _ := json.Marshal(rs)
		h := nats.Header{}
		h.Set(signing.Header, k.Sign(signing.Message{Subject: sealMsg.Subject, Seq: seq, Body: data}))
		return &store.StoredMsg{Subject: sealMsg.Subject, Seq: seq, Header: h, Data: data}
	}
	far := rs
	far.First += 10
	for _, tc := range []struct {
		name, reason string
		code         string
		seal         *store.StoredMsg
	}{
		{"signed by a stranger", signing.ReasonUnknown, store.CodeBadSignature, resign(stranger, sealMsg.Seq, rs)},
		{"copied to another place", signing.ReasonReplayed, store.CodeBadSignature, &store.StoredMsg{Subject: sealMsg.Subject, Seq: sealMsg.Seq - 1, Header: sealMsg.Header, Data: sealMsg.Data}},
		{"covering events not right after it", "", store.CodeInvalid, resign(key, sealMsg.Seq, far)},
		{"unsigned", signing.ReasonUnsigned, store.CodeBadSignature, &store.StoredMsg{Subject: sealMsg.Subject, Seq: sealMsg.Seq, Header: nats.Header{}, Data: sealMsg.Data}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seal *store.Seal
			_, _, errs := s.VerifyRouting(ctx, []*store.StoredMsg{tc.seal, unsigned(msgs[1]), msgs[2]}, &seal)
			if !store.HasCode(errs[0], tc.code) || store.AsError(errs[0]).Detail["reason"] != tc.reason {
				t.Fatalf("seal: %v, want %s %q", errs[0], tc.code, tc.reason)
			}
			if store.AsError(errs[1]).Detail["reason"] != signing.ReasonUnsigned {
				t.Fatalf("an unsigned event after a refused seal: %v", errs[1])
			}
			if errs[2] != nil {
				t.Fatalf("a signed event after a refused seal: %v", errs[2])
			}
		})
	}
}

// Appenders racing each other with sealed batches all land, in whatever
// order, and every event verifies; a publish retried with its message ID
// stores nothing twice.
func TestRacingSealedPublishes(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	routing := store.StreamOf(srv.Store, srv.Store.Names.RoutingEventsStream())
	info, _ := routing.Info(ctx)
	base := info.State.LastSeq
	var wg sync.WaitGroup
	const writers, each = 3, 700
	stores := make([]*store.Store, writers)
	for w := range writers {
		stores[w] = srv.Connect(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := stores[w].PublishRouting(ctx, fmt.Sprintf("w%d", w), upserts(fmt.Sprintf("w%d", w), each)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	s := srv.Store
	events := verifyAll(t, ctx, s, readStream(t, ctx, s, base+1))
	if len(events) != writers*each {
		t.Fatalf("%d events stored, want %d", len(events), writers*each)
	}
	// Each writer's events landed in the order it published them.
	next := map[string]int{}
	for _, ev := range events {
		if want := fmt.Sprintf("s%d", next[ev.Namespace]); ev.Service != want {
			t.Fatalf("%s's event %s landed at %d where %s was due", ev.Namespace, ev.Service, ev.Seq, want)
		}
		next[ev.Namespace]++
	}

	// The same publish again: every event is a duplicate of the first.
	evs := upserts("w0", each)
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	info, _ = sRouting.Info(ctx)
	before := info.State.LastSeq
	if _, err := stores[0].PublishRouting(ctx, "w0", evs); err != nil {
		t.Fatal(err)
	}
	after := readStream(t, ctx, s, before+1)
	for _, m := range after {
		if !s.IsSeal(m) {
			t.Fatalf("a retried publish stored event %d on %s again", m.Seq, m.Subject)
		}
	}
	if len(after) > 1 {
		t.Fatalf("a retried publish filed %d seals", len(after))
	}
}
