package storagenode_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// The default layout keeps the store key out of the data dir: a node
// whose auth dir is DATA/auth makes its key in DATA-keys, nothing in the
// data dir holds it, and a copy of the data dir alone does not open.
func TestStoreKeyOutsideTheDataDir(t *testing.T) {
	root := t.TempDir()
	dataDir := filepath.Join(root, "server")
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn, Progress: &out})
	keyFile := filepath.Join(root, "server-keys", "jetstream.key")
	if !strings.Contains(out.String(), "store encrypted at rest (ChaCha20-Poly1305; key in "+keyFile+" (default)") {
		t.Fatalf("progress:\n%s", out.String())
	}
	if strings.Contains(out.String(), "WARNING") {
		t.Fatalf("a warning on the default layout:\n%s", out.String())
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(keyFile); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s is %o", keyFile, fi.Mode().Perm())
	}
	putSecret(t, n)
	n.Close()
	if filesHold(t, dataDir, strings.TrimSpace(string(key))) {
		t.Fatal("the data dir holds the store key")
	}
	if filesHold(t, dataDir, secret) {
		t.Fatal("the secret is in the store's files")
	}
	// The node reads its store again with the key it finds there.
	n = boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn})
	getSecret(t, n)
	n.Close()

	// A copy of the data dir, whole, on another box: it does not open.
	stolen := filepath.Join(t.TempDir(), "server")
	if err := os.CopyFS(stolen, os.DirFS(dataDir)); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(stolen, "store.lock"))
	_, err = storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: stolen, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn})
	if !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "encrypted at rest") {
		t.Fatalf("a copy of the data dir: %v", err)
	}
}

// A node laid out before (the key in DATA/auth) keeps working with the
// same key, untouched, and says it should move; moved to DATA-keys, it is
// found there and the warning ends.
func TestStoreKeyInTheDataDirStillOpensWithAWarning(t *testing.T) {
	root := t.TempDir()
	dataDir := filepath.Join(root, "server")
	authDir := filepath.Join(dataDir, "auth")
	// An old node: its auth dir made with the key inside (as LoadAuth
	// always did), its store encrypted with it.
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	oldKey := filepath.Join(authDir, "jetstream.key")
	before, err := os.ReadFile(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn, Progress: &out})
	if !strings.Contains(out.String(), "WARNING: the store key "+oldKey+" is inside the data dir "+dataDir) ||
		!strings.Contains(out.String(), "key in "+oldKey+" (auth dir)") {
		t.Fatalf("progress:\n%s", out.String())
	}
	putSecret(t, n)
	n.Close()
	if after, _ := os.ReadFile(oldKey); !bytes.Equal(after, before) {
		t.Fatal("the key was changed")
	}
	if _, err := os.Stat(filepath.Join(root, "server-keys")); !os.IsNotExist(err) {
		t.Fatalf("a second key was made: %v", err)
	}
	// Moved where the warning says, it is found there.
	newKey := filepath.Join(root, "server-keys", "jetstream.key")
	if err := os.MkdirAll(filepath.Dir(newKey), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(oldKey, newKey); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	n = boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn, Progress: &out})
	if strings.Contains(out.String(), "WARNING") || !strings.Contains(out.String(), "key in "+newKey+" (default)") {
		t.Fatalf("progress after the move:\n%s", out.String())
	}
	getSecret(t, n)
	n.Close()
}

// Under systemd the key may come as a credential
// ($CREDENTIALS_DIRECTORY/jetstream.key): the node takes it, writes no
// key of its own, and opens its store with it again.
func TestStoreKeyFromSystemdCredentials(t *testing.T) {
	creds := t.TempDir()
	if _, err := storagenode.InitStoreKeyFile(filepath.Join(creds, "jetstream.key")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", creds)
	root := t.TempDir()
	dataDir := filepath.Join(root, "server")
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn, Progress: &out})
	if !strings.Contains(out.String(), "key in "+filepath.Join(creds, "jetstream.key")+" (systemd credential)") {
		t.Fatalf("progress:\n%s", out.String())
	}
	putSecret(t, n)
	n.Close()
	for _, f := range []string{filepath.Join(root, "server-keys"), filepath.Join(dataDir, "auth", "jetstream.key")} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s was made: %v", f, err)
		}
	}
	getSecret(t, boot(t, storagenode.BootConfig{DataDir: dataDir, Auth: storagenode.AuthOn}))
}
