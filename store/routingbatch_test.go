package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// nsBatch returns upserts of services s0..s<n-1> of ns from deploy, each
// about 1.5 KB (many hosts), so a few hundred take several parts.
func nsBatch(ns, deploy string, n int) []store.RoutingEvent {
	evs := make([]store.RoutingEvent, n)
	for i := range evs {
		svc := fmt.Sprintf("s%d", i)
		var hosts []string
		for h := range 40 {
			hosts = append(hosts, fmt.Sprintf("h%d.%s.%s.example.com", h, svc, ns))
		}
		evs[i] = store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: ns, Service: svc, DeployID: deploy,
			Routes:    []store.Route{{Hosts: hosts}},
			Endpoints: []store.Endpoint{{InstanceID: svc + "-" + deploy, Address: "10.0.0.1", Port: 8000 + i}}}
	}
	return evs
}

// loaded is what LoadRouting says of ns: each service's deploy, by name.
func loaded(t *testing.T, ctx context.Context, s *store.Store, ns string) (map[string]string, *store.RoutingState) {
	t.Helper()
	rs, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ev := range rs.Services {
		if ev.Namespace == ns {
			out[ev.Service] = ev.DeployID
		}
	}
	return out, rs
}

func wantDeploys(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("loaded %d services, want %d: %v", len(got), len(want), got)
	}
	for svc, d := range want {
		if got[svc] != d {
			t.Fatalf("%s loaded from %q, want %q", svc, got[svc], d)
		}
	}
}

func deploysOf(evs []store.RoutingEvent) map[string]string {
	out := map[string]string{}
	for _, ev := range evs {
		out[ev.Service] = ev.DeployID
	}
	return out
}

// A namespace's routing as a batch: a few parts under one seal, which a
// follower accepts by digest even stripped of their own signatures, and
// which a cold start reads as the namespace's state. The newest complete
// batch is authoritative: a smaller one drops what it left out (an older
// batch's parts on the part subjects past its count are ignored), a
// service's own later event beats it, an earlier one does not.
func TestRoutingBatchIsTheNamespacesState(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	info, _ := store.StreamOf(s, s.Names.RoutingEventsStream()).Info(ctx)
	base := info.State.LastSeq
	first := nsBatch("shop", "d1", 400)
	last, err := s.PublishRoutingBatch(ctx, "d1", "shop", first)
	if err != nil {
		t.Fatal(err)
	}
	msgs := readStream(t, ctx, s, base+1)
	if len(msgs) < 4 || !s.IsSeal(msgs[0]) || msgs[len(msgs)-1].Seq != last {
		t.Fatalf("a batch of 400 services of 1.5 KB: %v, last %d", seqsOf(msgs), last)
	}
	parts := len(msgs) - 1
	stripped := []*store.StoredMsg{msgs[0]}
	for i, m := range msgs[1:] {
		if ns, part, ok := s.Names.RoutingBatchOf(m.Subject); !ok || ns != "shop" || part != i || len(m.Data) > store.BatchPartBytes+1024 {
			t.Fatalf("part %d on %s, %d bytes", i, m.Subject, len(m.Data))
		}
		stripped = append(stripped, unsigned(m))
	}
	var seal *store.Seal
	_, got, errs := s.VerifyRouting(ctx, stripped, &seal)
	n := 0
	for i := range stripped[1:] {
		if errs[i+1] != nil {
			t.Fatalf("sealed part %d: %v", i, errs[i+1])
		}
		n += len(got[i+1].Events)
	}
	if n != 400 {
		t.Fatalf("the parts hold %d events, want 400", n)
	}
	state, _ := loaded(t, ctx, s, "shop")
	wantDeploys(t, state, deploysOf(first))

	// A service's own event after the batch wins over it.
	one := nsBatch("shop", "r1", 2)[1:]
	if _, err := s.PublishRouting(ctx, "", one); err != nil {
		t.Fatal(err)
	}
	want := deploysOf(first)
	want["s1"] = "r1"
	state, _ = loaded(t, ctx, s, "shop")
	wantDeploys(t, state, want)

	// A smaller batch: one part; parts 1.. of the first batch stay on
	// their subjects, and the services they hold are gone.
	second := nsBatch("shop", "d2", 10)
	second = append(second, store.RoutingEvent{Kind: store.EventServiceRemove, Namespace: "shop", Service: "s10", DeployID: "d2"})
	if _, err := s.PublishRoutingBatch(ctx, "d2", "shop", second); err != nil {
		t.Fatal(err)
	}
	state, _ = loaded(t, ctx, s, "shop")
	wantDeploys(t, state, deploysOf(second[:10]))
	if parts < 2 {
		t.Fatalf("the first batch had %d parts", parts)
	}
}

// A batch cut off halfway (its first part landed, the rest did not): its
// parts apply over the namespace's newest complete batch, read from the
// stream's history, and no service is dropped for being in a part that
// did not land. Publishing it again completes it.
func TestIncompleteRoutingBatchLaysOverTheLastComplete(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	first := nsBatch("shop", "d1", 400)
	if _, err := s.PublishRoutingBatch(ctx, "d1", "shop", first); err != nil {
		t.Fatal(err)
	}
	key, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	info, _ := store.StreamOf(s, s.Names.RoutingEventsStream()).Info(ctx)
	base := info.State.LastSeq
	second := nsBatch("shop", "d2", 400)
	msgs, err := s.SignRoutingBatch(key, base, "shop", second)
	if err != nil {
		t.Fatal(err)
	}
	// The seal and part 0 land; the publisher is gone before the rest.
	for i, m := range msgs[:2] {
		if _, err := s.JS.PublishMsg(ctx, m, jetstream.WithExpectLastSequence(base+uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	var part0 store.RoutingBatchPart
	if err := json.Unmarshal(msgs[1].Data, &part0); err != nil {
		t.Fatal(err)
	}
	want := deploysOf(first)
	for _, ev := range part0.Events {
		want[ev.Service] = "d2"
	}
	state, rs := loaded(t, ctx, s, "shop")
	wantDeploys(t, state, want)
	if len(rs.Skipped) != 0 {
		t.Fatalf("skipped %v", rs.Skipped)
	}
	if _, err := s.PublishRoutingBatch(ctx, "d2", "shop", second); err != nil {
		t.Fatal(err)
	}
	state, _ = loaded(t, ctx, s, "shop")
	wantDeploys(t, state, deploysOf(second))
}

// What a part may not be: of another namespace than its subject's, holding
// another namespace's events or anything but service events, filed as
// another part, signed by a stranger, or unsigned with no seal. Each is
// refused whole, by a follower and by a cold start, which keeps the
// namespace's last good batch.
func TestRoutingBatchPartRefusals(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	good := nsBatch("shop", "d1", 3)
	if _, err := s.PublishRoutingBatch(ctx, "d1", "shop", good); err != nil {
		t.Fatal(err)
	}
	key, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := signing.NewSigner()
	body := func(ns string, part int, evs []store.RoutingEvent) []byte {
		data, _ := json.Marshal(store.RoutingBatchPart{Version: 1, Batch: "evil", Namespace: ns, Part: part, Parts: 1, Events: evs})
		return data
	}
	other := nsBatch("bank", "evil", 1)
	mixed := append(nsBatch("shop", "evil", 1), other...)
	machine := []store.RoutingEvent{{Version: 1, Kind: store.EventMachineUpsert, Namespace: "shop", Service: "x",
		Machine: &store.MachineRecord{ID: "m1", Address: "203.0.113.9"}}}
	subj := s.Names.RoutingBatchSubject("shop", 0)
	for _, tc := range []struct {
		name, code, reason string
		key                *signing.Key
		subject            string
		data               []byte
	}{
		{"another namespace's part", store.CodeInvalid, "", key, subj, body("bank", 0, other)},
		{"another namespace's event in the part", store.CodeInvalid, "", key, subj, body("shop", 0, mixed)},
		{"a machine event in the part", store.CodeInvalid, "", key, subj, body("shop", 0, machine)},
		{"filed as another part", store.CodeInvalid, "", key, s.Names.RoutingBatchSubject("shop", 1), body("shop", 0, nsBatch("shop", "evil", 1))},
		{"forged", store.CodeBadSignature, signing.ReasonUnknown, stranger, subj, body("shop", 0, nsBatch("shop", "evil", 1))},
		{"unsigned, no seal", store.CodeBadSignature, signing.ReasonUnsigned, nil, subj, body("shop", 0, nsBatch("shop", "evil", 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, _ := store.StreamOf(s, s.Names.RoutingEventsStream()).Info(ctx)
			seq := info.State.LastSeq + 1
			m := nats.NewMsg(tc.subject)
			m.Data = tc.data
			if tc.key != nil {
				m.Header.Set(signing.Header, tc.key.Sign(signing.Message{Subject: tc.subject, Seq: seq, Body: tc.data}))
			}
			var seal *store.Seal
			_, parts, errs := s.VerifyRouting(ctx, []*store.StoredMsg{{Subject: tc.subject, Seq: seq, Header: m.Header, Data: tc.data}}, &seal)
			if !store.HasCode(errs[0], tc.code) || (tc.reason != "" && store.AsError(errs[0]).Detail["reason"] != tc.reason) || parts[0] != nil {
				t.Fatalf("a follower took it: %v, want %s %q", errs[0], tc.code, tc.reason)
			}
			if _, err := s.JS.PublishMsg(ctx, m, jetstream.WithExpectLastSequence(seq-1)); err != nil {
				t.Fatal(err)
			}
			state, rs := loaded(t, ctx, s, "shop")
			if !slices.ContainsFunc(rs.Refused, func(r store.RefusedEvent) bool { return r.Seq == seq && store.HasCode(r.Err, tc.code) }) {
				t.Fatalf("a cold start did not refuse it: refused %v", rs.Refused)
			}
			for svc, d := range state {
				if d != "d1" {
					t.Fatalf("%s loaded from %s", svc, d)
				}
			}
			if len(state) != 3 && !strings.Contains(tc.name, "another part") {
				t.Fatalf("loaded %v, want the good batch's 3 services (skipped %v)", state, rs.Skipped)
			}
			// Put the good batch back on top for the next case.
			if _, err := s.PublishRoutingBatch(ctx, "d1-"+tc.name, "shop", nsBatch("shop", "d1", 3)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// BenchmarkPublishRoutingBatch is BenchmarkPublishRouting's events as the
// control plane publishes a commit's routing now: calls of 1000 events of
// one namespace, each call one routing batch under one seal.
func BenchmarkPublishRoutingBatch(b *testing.B) {
	srv := storetest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; done += 1000 {
		if _, err := srv.Store.PublishRoutingBatch(ctx, "", "bench", upserts("bench", min(1000, b.N-done))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}
