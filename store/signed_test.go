package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// lastOf reads the last stored message of subject in stream.
func lastOf(t *testing.T, ctx context.Context, s *store.Store, stream, subject string) *store.StoredMsg {
	t.Helper()
	var found *store.StoredMsg
	if err := s.LastOf(ctx, stream, []string{subject}, func(m *store.StoredMsg) error { found = m; return nil }); err != nil {
		t.Fatal(err)
	}
	if found == nil {
		t.Fatalf("nothing on %s", subject)
	}
	return found
}

// Every way of putting routing on the stream without a signer's key is
// refused by a reader: unsigned, signed by a key the root never certified,
// a valid event copied again, a valid signature over another body.
func TestLoadRoutingRefusesWhatTheControlPlaneDidNotSign(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	if _, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{"web": web("127.0.0.1", 9000, "w1")}); err != nil {
		t.Fatal(err)
	}
	stream := s.Names.RoutingEventsStream()
	subj := s.Names.RoutingServiceSubject("shop", "web")
	good := lastOf(t, ctx, s, stream, subj)
	if why := storetest.Refused(t, ctx, s, subj); why != "" {
		t.Fatalf("the signed event was refused: %s", why)
	}
	forged := store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		Routes: []store.Route{{Hosts: []string{"shop.example.com"}}}, Endpoints: []store.Endpoint{{InstanceID: "evil", Address: "203.0.113.9", Port: 80}}}
	body, _ := json.Marshal(forged)
	stranger, _ := signing.NewSigner()
	publish := func(hdr string, data []byte) {
		t.Helper()
		m := nats.NewMsg(subj)
		m.Data = data
		if hdr != "" {
			m.Header.Set(signing.Header, hdr)
		}
		if _, err := s.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	info, _ := sRouting.Info(ctx)
	next := info.State.LastSeq + 1
	for _, tc := range []struct {
		name, hdr, reason string
		data              []byte
	}{
		{"unsigned", "", signing.ReasonUnsigned, body},
		{"signed by a stranger", stranger.Sign(signing.Message{Subject: subj, Seq: next + 1, Body: body}), signing.ReasonUnknown, body},
		{"a valid event copied again", good.Header.Get(signing.Header), signing.ReasonReplayed, good.Data},
		{"a valid signature over another body", strings.Replace(good.Header.Get(signing.Header), " "+itoa(good.Seq)+" ", " "+itoa(next+3)+" ", 1), signing.ReasonBadSignature, body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			publish(tc.hdr, tc.data)
			next++
			if why := storetest.Refused(t, ctx, s, subj); why != tc.reason {
				t.Fatalf("refused for %q, want %q", why, tc.reason)
			}
		})
	}
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// A commit written without a signer's key is never acted on: the live
// commit reads as bad_signature.
func TestForgedCommitIsRefused(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	c := &store.DeployCommit{Version: 1, ID: "forged", Namespace: "shop", Kind: store.CommitFinal, Revision: 9, Manifest: store.Manifest{Namespace: "shop"}}
	data, _ := json.Marshal(c)
	if _, err := s.JS.Publish(ctx, s.Names.DeployCommitSubject("shop", store.CommitFinal), data); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LiveCommit(ctx, "shop"); !store.HasCode(err, store.CodeBadSignature) {
		t.Fatalf("forged live commit: got %v, want bad_signature", err)
	}
	good, bad, err := s.CommitHistory(ctx, "shop")
	if err != nil || len(good) != 0 || len(bad) != 1 {
		t.Fatalf("history: %v good, %v refused, %v", good, bad, err)
	}
}

// A second trust root cannot take over a store: the store names the first.
func TestStoreKeepsItsTrustRoot(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	other, _ := signing.NewRoot()
	if err := srv.Store.PublishTrustRoot(ctx, other); !store.HasCode(err, store.CodeConflict) {
		t.Fatalf("another root: got %v, want conflict", err)
	}
	_, err := signers.Server(ctx, srv.Connect(t), t.TempDir(), t.TempDir(), "intruder")
	if !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("a server with no root and no signer: got %v, want not_found naming the trust root", err)
	}
	// A certificate the root did not sign makes nobody a signer.
	stranger, _ := signing.NewSigner()
	rec := store.SignerRecord{Version: 1, Key: stranger.PublicKey(), Name: "intruder"}
	data, _ := json.Marshal(rec)
	m := nats.NewMsg("$KV." + srv.Store.Names.SignersBucket() + "." + store.SignerKey(stranger.PublicKey()))
	m.Data = data
	m.Header.Set(signing.Header, stranger.Sign(signing.Message{Subject: m.Subject, Seq: 99, Body: data}))
	if _, err := srv.Store.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	recs, bad, err := srv.Store.ListSigners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Key == stranger.PublicKey() {
			t.Fatal("a self-certified signer was listed as certified")
		}
	}
	if len(bad) != 1 {
		t.Fatalf("refused certificates: %v", bad)
	}
}

// Appenders racing on one stream all land, each signed for the sequence it
// got.
func TestRacingSignedAppendsAllVerify(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	stores := []*store.Store{srv.Store, srv.Connect(t), srv.Connect(t)}
	errc := make(chan error, len(stores))
	for i, s := range stores {
		go func() {
			var err error
			for j := 0; j < 20 && err == nil; j++ {
				_, err = s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert,
					Machine: &store.MachineRecord{Version: 1, ID: "m" + itoa(uint64(i)), State: store.MachineActive}}})
			}
			errc <- err
		}()
	}
	for range stores {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	reader := srv.Connect(t)
	var n int
	_, err := reader.ReadFrom(ctx, reader.Names.RoutingEventsStream(), 1, "", func(m *store.StoredMsg) error {
		n++
		var ev store.RoutingEvent
		return reader.VerifyEvent(ctx, m, &ev)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(stores)*store.RoutingHistory {
		t.Fatalf("%d events kept, want %d", n, len(stores)*store.RoutingHistory)
	}
}

// Without a signer a process cannot write intent, and says why.
func TestWritingIntentNeedsASigner(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	nc := srv.Conn(t)
	s, err := store.Open(ctx, nc, srv.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, Machine: &store.MachineRecord{Version: 1, ID: "m1"}}})
	if !store.HasCode(err, store.CodeSigningKeyRequired) {
		t.Fatalf("got %v, want signing_key_required", err)
	}
	sRouting := store.StreamOf(s, s.Names.RoutingEventsStream())
	if info, _ := sRouting.Info(ctx); info.State.Msgs != 0 {
		t.Fatalf("%d events stored", info.State.Msgs)
	}
}
