package storagenode_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A storage node keeps its control credentials across restarts: a restart
// mints none (the file is the same, private again whatever its mode was),
// and new ones replace them only when they no longer serve: revoked, made
// by other auth keys, or unreadable. Every time the node connects with
// what the file holds.
func TestControlCredsKeptAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, storagenode.ControlCredsFile)
	start := func(want string) []byte {
		t.Helper()
		var out bytes.Buffer
		n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOn, Progress: &out})
		if !strings.Contains(out.String(), want) {
			t.Fatalf("progress:\n%s\nwant %q", out.String(), want)
		}
		b, err := os.ReadFile(creds)
		if err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(creds); fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s is %o", creds, fi.Mode().Perm())
		}
		// The file in place connects and binds the store.
		nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: creds})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := store.Open(ctx, nc, n.Store.Names)
		if err != nil {
			t.Fatalf("binding with %s: %v", creds, err)
		}
		if err := s.RequireQuorum(ctx); err != nil {
			t.Fatal(err)
		}
		n.Close()
		return b
	}
	first := start("new control credentials (those before: none yet)")
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	if again := start("control credentials kept from the last start"); !bytes.Equal(again, first) {
		t.Fatal("a restart minted new control credentials")
	}

	// Revoked: new ones, and the node runs on them.
	who, err := store.UserOfCreds(first)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		n := boot(t, storagenode.BootConfig{DataDir: dir, Auth: storagenode.AuthOn})
		defer n.Close()
		if err := n.Store.RevokeUser(context.Background(), who); err != nil {
			t.Fatal(err)
		}
	}()
	revoked := start("were revoked: new ones")
	if bytes.Equal(revoked, first) {
		t.Fatal("revoked control credentials were kept")
	}

	// Made by another auth dir's keys: new ones.
	other, err := storagenode.LoadAuth(filepath.Join(t.TempDir(), "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.WriteCredsFile(creds, storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "control-server"}); err != nil {
		t.Fatal(err)
	}
	foreign, _ := os.ReadFile(creds)
	if b := start("those before: signed by other auth keys"); bytes.Equal(b, foreign) {
		t.Fatal("credentials of other auth keys were kept")
	}
	// Another role's credentials of the same keys: new ones.
	a, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.WriteCredsFile(creds, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"}); err != nil {
		t.Fatal(err)
	}
	start("new control credentials (those before:")
	// Garbage: new ones.
	if err := os.WriteFile(creds, []byte("not credentials"), 0o600); err != nil {
		t.Fatal(err)
	}
	start("those before: unreadable")
}
