package store_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// An order's body is the request itself with the envelope beside its
// fields: an agent that does not check orders yet (an older release)
// reads the request it always did.
func TestOrderBodyIsTheRequest(t *testing.T) {
	names, _ := store.NewNames("", "")
	k, err := signing.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []any{
		store.StartRequest{Instance: store.InstanceRecord{ID: "i1", Namespace: "shop", Service: "web"}, Spec: store.ServiceSpec{Command: []string{"hello"}}},
		store.UpgradeRequest{Release: "1.2.0", Attempt: 3, AllowDowngrade: true},
		struct{}{},
	} {
		o, err := store.NewOrder("m1", store.CmdUpgrade, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		body, h, err := names.SignOrder(k, o, req)
		if err != nil {
			t.Fatal(err)
		}
		if h.Get(signing.Header) == "" {
			t.Fatal("no signature")
		}
		got := reflect.New(reflect.TypeOf(req))
		if err := json.Unmarshal(body, got.Interface()); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if !reflect.DeepEqual(got.Elem().Interface(), req) {
			t.Fatalf("read back %+v from %s, want %+v", got.Elem().Interface(), body, req)
		}
		var env struct {
			Order store.Order `json:"order"`
		}
		if err := json.Unmarshal(body, &env); err != nil || env.Order.Nonce != o.Nonce {
			t.Fatalf("envelope of %s: %+v %v", body, env, err)
		}
	}
	if _, _, err := names.SignOrder(k, store.Order{}, []string{"not an object"}); err == nil {
		t.Fatal("an order of a request that is no JSON object")
	}
}

// BenchmarkOrder is what an order adds to an agent RPC: signing it, and
// the agent's check (the signer's certificate read from the store, the
// signature, the nonce noted in a book on disk).
func BenchmarkOrder(b *testing.B) {
	srv := storetest.Start(b)
	s := srv.Store
	ctx := context.Background()
	k, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		b.Fatal(err)
	}
	book, err := store.OpenOrderBook(filepath.Join(b.TempDir(), "orders"))
	if err != nil {
		b.Fatal(err)
	}
	defer book.Close()
	req := store.InstanceRequest{InstanceID: "i1", Namespace: "shop"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o, err := store.NewOrder("m1", store.CmdStopInstance, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		body, h, err := s.Names.SignOrder(k, o, req)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.VerifyOrder(ctx, "m1", store.CmdStopInstance, h, body, book); err != nil {
			b.Fatal(err)
		}
	}
}
