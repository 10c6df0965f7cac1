package storetest

import (
	"context"
	"testing"

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
