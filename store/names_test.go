package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
	"github.com/nats-io/nats.go/jetstream"
)

func TestKeySafeRoundTripsEveryByte(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	var all []byte
	for c := 0; c < 256; c++ {
		all = append(all, byte(c))
	}
	cases := []string{
		string(all), "shop.example.com", "*.example.com", "Shop.Example.COM.",
		"https://acme-v02.api.letsencrypt.org/directory", ".lead", "trail.", "a..b", "_x_", "10.100.0.0/16",
	}
	locks := store.BucketOf(srv.Store, srv.Store.Names.LocksBucket())
	for _, in := range cases {
		enc := store.KeySafe(in)
		dec, err := store.DecodeKeySafe(enc)
		if err != nil || dec != in {
			t.Fatalf("round trip %q -> %q -> %q (%v)", in, enc, dec, err)
		}
		// The encoded form must be usable as a KV key as it is.
		if _, err := locks.Put(ctx, "cp.lock.test."+enc, []byte("x")); err != nil {
			t.Fatalf("KV rejected encoded key %q of %q: %v", enc, in, err)
		}
	}
	if got := store.KeySafe("shop.example.com"); got != "shop.example.com" {
		t.Fatalf("plain hostnames should stay readable, got %q", got)
	}
	if _, err := store.DecodeKeySafe("bad_z"); err == nil {
		t.Fatal("want an error for a truncated escape")
	}
}

func TestNewNamesRejectsBadTokens(t *testing.T) {
	for _, bad := range []string{"a.b", "a b", "a*", ">"} {
		if _, err := store.NewNames(bad, ""); err == nil {
			t.Errorf("installation %q accepted", bad)
		}
		if _, err := store.NewNames("", bad); err == nil {
			t.Errorf("authority %q accepted", bad)
		}
	}
	n, err := store.NewNames("", "")
	if err != nil || n.Installation != "local" || n.Authority != "default" {
		t.Fatalf("defaults: %+v %v", n, err)
	}
	if got := n.RPCSubject("m1", "deploy.start_candidate"); got != "edgeplane.v1.local.default.rpc.node.m1.deploy.start_candidate" {
		t.Fatalf("rpc subject %q", got)
	}
	if got := n.NodeListenSubject("m1"); got != "edgeplane.v1.local.*.rpc.node.m1.>" {
		t.Fatalf("listen subject %q", got)
	}
}

func TestProvisionIsIdempotentAndCommitsImmutable(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	again := srv.Connect(t) // provisions a second time
	c := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1}
	seq, err := again.AppendCommit(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	commits := store.StreamOf(srv.Store, srv.Store.Names.DeployCommitsStream())
	if err := commits.DeleteMsg(ctx, seq); err == nil {
		t.Fatal("deleting a commit succeeded; the stream must deny deletes")
	}
	if err := commits.Purge(ctx); err == nil {
		t.Fatal("purging commits succeeded; the stream must deny purges")
	}
	live, err := srv.Store.LiveCommit(ctx, "shop")
	if err != nil || live.ID != "d1" || live.Seq != seq {
		t.Fatalf("live commit: %+v %v", live, err)
	}
	nss, err := srv.Store.CommittedNamespaces(ctx)
	if err != nil || strings.Join(nss, ",") != "shop" {
		t.Fatalf("namespaces %v %v", nss, err)
	}
	if _, err := srv.Store.LiveCommit(ctx, "nope"); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("missing namespace: %v", err)
	}
}

func TestDecodeRejectsNewerSchema(t *testing.T) {
	var r store.InstanceRecord
	if err := store.Decode("instance", []byte(`{"version": 99}`), &r); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("got %v", err)
	}
	if err := store.Decode("instance", []byte(`{not json`), &r); err == nil {
		t.Fatal("want a decode error")
	}
}

// A write JetStream has no room for is a structured storage_full error, and
// the value already stored is kept.
func TestFullBucketIsStorageFull(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	kv, err := srv.Store.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "tiny", MaxBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	var full error
	for i := 0; i < 50 && full == nil; i++ {
		_, full = store.PutJSON(ctx, kv, fmt.Sprintf("k%d", i), map[string]string{"pad": strings.Repeat("x", 64)})
	}
	if !store.HasCode(full, store.CodeStorageFull) {
		t.Fatalf("write into a full bucket: %v; want storage_full", full)
	}
	if _, err := kv.Get(ctx, "k0"); err != nil {
		t.Fatalf("the first value was dropped to make room: %v", err)
	}
	// A value past the largest message is invalid, not a full store.
	big, err := srv.Store.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "small_values", MaxValueSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutJSON(ctx, big, "k", map[string]string{"pad": strings.Repeat("x", 200)}); !store.HasCode(err, store.CodeInvalid) {
		t.Fatalf("oversized value: %v; want invalid", err)
	}
}
