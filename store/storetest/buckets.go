package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// Bucket binds the KV bucket named name on st's connection, for a test
// that reads or plants raw records the typed methods of store never
// would.
func Bucket(t testing.TB, st *store.Store, name string) jetstream.KeyValue {
	t.Helper()
	kv, err := st.JS.KeyValue(context.Background(), name)
	if err != nil {
		t.Fatalf("binding bucket %s: %v", name, err)
	}
	return kv
}

// Stream binds the stream named name on st's connection.
func Stream(t testing.TB, st *store.Store, name string) jetstream.Stream {
	t.Helper()
	str, err := st.JS.Stream(context.Background(), name)
	if err != nil {
		t.Fatalf("binding stream %s: %v", name, err)
	}
	return str
}

// FutureFloor writes a floor of schema generation gen needing release into
// s's store, raw, as a control server of a future release would: the
// processes of this build are to refuse that store.
func FutureFloor(t testing.TB, s *store.Store, gen int, release string) {
	t.Helper()
	f := store.StoreFloor{Version: store.RecordVersion, MinGeneration: gen, MinRelease: release,
		SetBy: "control server future (" + release + ")", At: time.Now().UTC()}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Bucket(t, s, s.Names.MetaBucket()).Put(context.Background(), "floor", data); err != nil {
		t.Fatal(err)
	}
}
