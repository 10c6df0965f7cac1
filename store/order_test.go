package store_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
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
