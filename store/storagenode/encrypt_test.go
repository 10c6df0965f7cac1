package storagenode_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// secret is a value written to the store that must not be found in its
// files when the store is encrypted.
const secret = "-----BEGIN PRIVATE KEY----- not really, but as secret"

func putSecret(t *testing.T, n *storagenode.Node) {
	t.Helper()
	nCerts := storetest.Bucket(t, n.Store, n.Store.Names.CertsBucket())
	if _, err := nCerts.Put(context.Background(), "certificates/shop.example.com.key", []byte(secret)); err != nil {
		t.Fatal(err)
	}
}

func getSecret(t *testing.T, n *storagenode.Node) {
	t.Helper()
	nCerts := storetest.Bucket(t, n.Store, n.Store.Names.CertsBucket())
	e, err := nCerts.Get(context.Background(), "certificates/shop.example.com.key")
	if err != nil || string(e.Value()) != secret {
		t.Fatalf("reading the secret back: %v", err)
	}
}

// filesHold reports whether any file under dir holds s.
func filesHold(t *testing.T, dir, s string) bool {
	t.Helper()
	found := false
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(path)
		found = found || bytes.Contains(b, []byte(s))
		return nil
	})
	return found
}

// A node with a new auth dir encrypts its store: what it holds is not in
// its files, and it reads it back after a restart with the same key.
func TestStoreEncryptedAtRest(t *testing.T) {
	dataDir, authDir := t.TempDir(), t.TempDir()
	var out bytes.Buffer
	cfg := storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir, Progress: &out}
	n := boot(t, cfg)
	if !strings.Contains(out.String(), "store encrypted at rest (ChaCha20-Poly1305; key in "+filepath.Join(authDir, "jetstream.key")) {
		t.Fatalf("progress:\n%s", out.String())
	}
	putSecret(t, n)
	n.Close() // flushes the store
	if filesHold(t, dataDir, secret) {
		t.Fatal("the secret is in the store's files")
	}
	if l, err := storagenode.ReadStoreLayout(dataDir); err != nil || !l.Encrypted {
		t.Fatalf("layout %+v %v", l, err)
	}
	getSecret(t, boot(t, storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir}))
}

// An encrypted store is not opened without its key, or with another: the
// node refuses to start rather than finding an empty store.
func TestEncryptedStoreNeedsItsKey(t *testing.T) {
	dataDir, authDir := t.TempDir(), t.TempDir()
	n := boot(t, storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir})
	putSecret(t, n)
	n.Close()
	_, err := storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir,
		Encrypt: storagenode.ToggleOff})
	if !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "is encrypted at rest") {
		t.Fatalf("--encrypt off on an encrypted store: %v", err)
	}
	if err := os.WriteFile(filepath.Join(authDir, "jetstream.key"), []byte(strings.Repeat("k", 43)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = storagenode.Boot(context.Background(), storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir})
	if !store.HasCode(err, store.CodeInvalid) || !strings.Contains(err.Error(), "another store key") {
		t.Fatalf("another key: %v", err)
	}
}

// A store written before encryption at rest is encrypted in place once
// its auth dir gets a key: same data, no longer in the clear.
func TestPlaintextStoreIsEncryptedWhenTheKeyComes(t *testing.T) {
	dataDir, authDir := t.TempDir(), t.TempDir()
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(authDir, "jetstream.key")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	n := boot(t, storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir, Progress: &out})
	if !strings.Contains(out.String(), "holds no store key, so the store in "+dataDir+" is not encrypted at rest") {
		t.Fatalf("progress:\n%s", out.String())
	}
	putSecret(t, n)
	n.Close()
	if !filesHold(t, dataDir, secret) {
		t.Fatal("the plaintext store does not hold the secret: this test checks nothing")
	}
	if _, err := storagenode.InitStoreKey(authDir); err != nil {
		t.Fatal(err)
	}
	n = boot(t, storagenode.BootConfig{DataDir: dataDir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn, AuthDir: authDir})
	getSecret(t, n)
	n.Close()
	if filesHold(t, dataDir, secret) {
		t.Fatal("the secret is still in the store's files after encryption")
	}
}

// BenchmarkStoreWrites is the cost of encryption at rest: the same KV puts
// (2 KiB, a certificate's size) to a plaintext and to an encrypted store,
// in one process, one after the other.
//
//	go test -run '^$' -bench StoreWrites -benchtime 5000x ./store/storagenode/
func BenchmarkStoreWrites(b *testing.B) {
	value := bytes.Repeat([]byte("x"), 2048)
	for _, tc := range []struct{ name, key string }{{"plaintext", ""}, {"encrypted", strings.Repeat("k", 43)}} {
		b.Run(tc.name, func(b *testing.B) {
			ns, err := storagenode.Start(storagenode.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", StoreKey: tc.key})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
			nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL()})
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			names, _ := store.NewNames("", "")
			s, err := store.Provision(context.Background(), nc, names, store.Layout{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			sCerts := storetest.Bucket(b, s, s.Names.CertsBucket())
			b.SetBytes(int64(len(value)))
			b.ResetTimer()
			for i := range b.N {
				if _, err := sCerts.Put(ctx, "certificates/host"+strconv.Itoa(i%1000)+".key", value); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
