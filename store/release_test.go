package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func pushTestRelease(t *testing.T, ctx context.Context, s *store.Store, release string, bins map[string][]byte) *store.ReleaseRecord {
	t.Helper()
	readers := map[string]io.Reader{}
	for n, b := range bins {
		readers[n] = bytes.NewReader(b)
	}
	rel := &store.ReleaseRecord{Release: release, Arch: "linux/amd64"}
	if err := s.PushRelease(ctx, rel, readers); err != nil {
		t.Fatalf("push %s: %v", release, err)
	}
	return rel
}

func TestReleasePushFetchAndRefusals(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	s := srv.Store
	big := make([]byte, 700_000) // several object store chunks
	rand.Read(big)
	meshd := []byte("#!/bin/sh\necho meshd\n")
	pushTestRelease(t, ctx, s, "1.2.0", map[string][]byte{"control": big, "meshd": meshd})

	rel, err := s.Release(ctx, "1.2.0", "linux/amd64")
	if err != nil {
		t.Fatal(err)
	}
	if rel.Binaries["control"].Size != int64(len(big)) || len(rel.Binaries) != 2 {
		t.Fatalf("record: %+v", rel)
	}
	var got bytes.Buffer
	if err := s.FetchReleaseBinary(ctx, rel, "control", &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), big) {
		t.Fatal("fetched bytes differ from pushed")
	}

	t.Run("a version is never replaced", func(t *testing.T) {
		err := s.PushRelease(ctx, &store.ReleaseRecord{Release: "1.2.0", Arch: "linux/amd64"}, map[string]io.Reader{"control": strings.NewReader("other")})
		if !store.HasCode(err, store.CodeConflict) {
			t.Fatalf("got %v, want conflict", err)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			rel  store.ReleaseRecord
			bins map[string]io.Reader
		}{
			{store.ReleaseRecord{Release: "dev", Arch: "linux/amd64"}, map[string]io.Reader{"control": strings.NewReader("x")}},
			{store.ReleaseRecord{Release: "1.3.0", Arch: "amd64"}, map[string]io.Reader{"control": strings.NewReader("x")}},
			{store.ReleaseRecord{Release: "1.3.0", Arch: "linux/amd64"}, map[string]io.Reader{"sh": strings.NewReader("x")}},
			{store.ReleaseRecord{Release: "1.3.0", Arch: "linux/amd64"}, nil},
		} {
			if err := s.PushRelease(ctx, &tc.rel, tc.bins); !store.HasCode(err, store.CodeInvalid) {
				t.Errorf("push %+v: got %v, want invalid", tc.rel, err)
			}
		}
	})
	t.Run("no signer", func(t *testing.T) {
		plain, err := store.Open(ctx, srv.Conn(t), s.Names)
		if err != nil {
			t.Fatal(err)
		}
		err = plain.PushRelease(ctx, &store.ReleaseRecord{Release: "1.4.0", Arch: "linux/amd64"}, map[string]io.Reader{"control": strings.NewReader("x")})
		if !store.HasCode(err, store.CodeSigningKeyRequired) {
			t.Fatalf("got %v, want signing_key_required", err)
		}
	})

	// Records written past the signer: a reader refuses each.
	subj := "$KV." + s.Names.ReleasesBucket() + "."
	forge := func(release, hdr string) {
		t.Helper()
		body, _ := json.Marshal(store.ReleaseRecord{Version: 1, Release: release, Arch: "linux/amd64", Binaries: rel.Binaries})
		m := nats.NewMsg(subj + store.ReleaseKey(release, "linux/amd64"))
		m.Data = body
		if hdr != "" {
			m.Header.Set(signing.Header, hdr)
		}
		if _, err := s.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	str, _ := s.JS.Stream(ctx, "KV_"+s.Names.ReleasesBucket())
	info, _ := str.Info(ctx)
	next := info.State.LastSeq + 1
	stranger, _ := signing.NewSigner()
	forge("1.5.0", "")
	forge("1.6.0", stranger.Sign(signing.Message{Subject: subj + store.ReleaseKey("1.6.0", "linux/amd64"), Seq: next + 1}))
	for release, reason := range map[string]string{"1.5.0": signing.ReasonUnsigned, "1.6.0": signing.ReasonUnknown} {
		_, err := s.Release(ctx, release, "linux/amd64")
		var se *store.Error
		if !store.HasCode(err, store.CodeBadSignature) || !errors.As(err, &se) || se.Detail["reason"] != reason {
			t.Errorf("release %s: got %v, want bad_signature (%s)", release, err, reason)
		}
	}
	good, bad, err := s.ListReleases(ctx)
	if err != nil || len(good) != 1 || good[0].Release != "1.2.0" || len(bad) != 2 {
		t.Fatalf("ls: good %v bad %v err %v", good, bad, err)
	}

	// Bytes changed in the object store after the push: the digest in the
	// signed record does not match and the fetch says so.
	t.Run("tampered binary", func(t *testing.T) {
		obs, err := s.JS.ObjectStore(ctx, s.Names.ReleaseBinariesStore())
		if err != nil {
			t.Fatal(err)
		}
		evil := bytes.Clone(meshd)
		evil[len(evil)-2] = 'X'
		if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: rel.Binaries["meshd"].Object}, bytes.NewReader(evil)); err != nil {
			t.Fatal(err)
		}
		var sink bytes.Buffer
		err = s.FetchReleaseBinary(ctx, rel, "meshd", &sink)
		var se *store.Error
		if !errors.As(err, &se) || se.Code != store.CodeBadSignature || se.Detail["reason"] != "digest_mismatch" {
			t.Fatalf("got %v, want bad_signature (digest_mismatch)", err)
		}
		// Longer bytes are cut at the signed size and refused as well.
		if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: rel.Binaries["meshd"].Object}, bytes.NewReader(append(bytes.Clone(meshd), "more"...))); err != nil {
			t.Fatal(err)
		}
		sink.Reset()
		if err := s.FetchReleaseBinary(ctx, rel, "meshd", &sink); !store.HasCode(err, store.CodeBadSignature) || sink.Len() > len(meshd) {
			t.Fatalf("got %v after %d bytes, want bad_signature within %d", err, sink.Len(), len(meshd))
		}
	})
}
