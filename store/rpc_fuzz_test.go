package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// FuzzRPCReply drives store.Call with arbitrary reply bytes from a real responder
// on a real embedded server: undecodable replies are rpc_failure errors.
func FuzzRPCReply(f *testing.F) {
	for _, s := range []string{``, `{}`, `null`, `{"result":1}`, `{"result":{"machine":"m1","free":3}}`, `{"result":"x"}`,
		`{"error":{"code":"busy","message":"held"}}`, `{"error":null,"result":null}`, `{"error":"x"}`, `[1,2]`, "\x00\xff"} {
		f.Add([]byte(s))
	}
	nc := storetest.Start(f).Conn(f)
	var mu sync.Mutex
	var reply []byte
	sub, err := nc.Subscribe("fuzz.rpc", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		_ = m.Respond(reply)
	})
	if err != nil {
		f.Fatal(err)
	}
	defer sub.Unsubscribe()
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		reply = data
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var rep store.CapacityReply
		err := store.Call(ctx, nc, "fuzz.rpc", "m1", store.CmdCapacity, store.CapacityRequest{}, &rep)
		if err == nil {
			return
		}
		se := store.AsError(err)
		if se.Code == "" || se.Message == "" {
			t.Fatalf("unstructured error %v", err)
		}
		if store.HasCode(err, store.CodeRPCFailure) && !strings.Contains(err.Error(), "m1") {
			t.Fatalf("rpc failure does not name the machine: %v", err)
		}
	})
}
