package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

func TestScratchAuthCluster(t *testing.T) {
	dir := t.TempDir()
	auth, err := store.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	nodes := startCluster(t, auth)
	creds := writeCreds(t, auth, store.CredsRequest{Role: store.RoleControl})
	nc, err := store.Connect(store.ConnectOptions{URL: nodes[0].ns.ClientURL(), CredsFile: creds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := store.WaitForJetStream(ctx, nc); err != nil {
		t.Fatal(err)
	}
	names, _ := store.NewNames("", "")
	for i := 0; i < 20; i++ {
		_, err = store.Provision(ctx, nc, names, store.Layout{Replicas: 3})
		t.Logf("provision: %v  routes=%d", err, nodes[0].ns.NumRoutes())
		if err == nil {
			break
		}
		time.Sleep(time.Second)
	}
}
