package certs_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// linkedStorage is a storage on its own link to the server at addr (which
// may not be up), with a local copy in dir, as the Caddy module makes it.
func linkedStorage(t *testing.T, addr, dir string) (*certs.Storage, *store.Link) {
	t.Helper()
	l, err := store.NewLink(store.Config{NATSURL: "nats://" + addr}, store.LinkOptions{
		Name: t.Name(), Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := certs.New(l, certs.Options{LockTTL: 2 * time.Second, LocalDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); l.Close() })
	return s, l
}

// A gateway that boots while the store is down serves the certificates it
// held from its local copy, refuses every write and lock at once with
// store_unavailable, and once the store answers the copy yields to it: a
// certificate renewed elsewhere meanwhile wins, one removed elsewhere goes.
func TestLocalCopyServesWhileTheStoreIsDown(t *testing.T) {
	addr, natsDir, local := storetest.FreeAddr(t), t.TempDir(), filepath.Join(t.TempDir(), "certs")
	ctx := context.Background()
	k := certmagic.StorageKeys
	iss := "acme-v02.api.letsencrypt.org-directory"
	crt, key, meta := k.SiteCert(iss, "shop.example.com"), k.SitePrivateKey(iss, "shop.example.com"), k.SiteMeta(iss, "shop.example.com")
	gone := k.SiteCert(iss, "gone.example.com")
	staple := "ocsp/shop.example.com-1a2b3c"
	account := "acme/" + iss + "/users/ops@example.com/ops.key"

	// Before the outage: the gateway stores and loads as usual.
	srv := storetest.StartIn(t, natsDir, addr)
	s1, l1 := linkedStorage(t, addr, local)
	if _, err := l1.Wait(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{crt, "cert v1"}, {key, "key v1"}, {meta, "meta v1"}, {gone, "gone v1"}, {staple, "staple"}, {account, "account key"}} {
		mustStore(t, s1, kv[0], kv[1])
	}
	info, err := s1.Stat(ctx, crt)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{crt, key, staple} {
		st, err := os.Stat(filepath.Join(local, filepath.FromSlash(f)))
		if err != nil {
			t.Fatalf("local copy of %s: %v", f, err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("local copy of %s has mode %v; want 0600", f, st.Mode())
		}
	}
	if _, err := os.Stat(filepath.Join(local, filepath.FromSlash(account))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the local copy holds the ACME account key (%v): only certificates, keys and staples are copied", err)
	}
	s1.Close()
	l1.Close()

	// Meanwhile another gateway renews one certificate and removes another.
	other := srv.Store
	otherCerts := storetest.Bucket(t, other, other.Names.CertsBucket())
	if _, err := otherCerts.Put(ctx, mustEncode(t, crt), []byte("cert v2")); err != nil {
		t.Fatal(err)
	}
	if err := otherCerts.Delete(ctx, mustEncode(t, gone)); err != nil {
		t.Fatal(err)
	}
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()

	// The gateway boots during the outage.
	s2, l2 := linkedStorage(t, addr, local)
	storetest.Eventually(t, 5*time.Second, "a failed dial", func() bool { return l2.State().Attempts > 0 })
	for f, want := range map[string]string{crt: "cert v1", key: "key v1", meta: "meta v1", staple: "staple"} {
		if got, err := s2.Load(ctx, f); err != nil || string(got) != want {
			t.Fatalf("offline Load(%s) = %q, %v; want %q from the local copy", f, got, err, want)
		}
	}
	if got, err := s2.Stat(ctx, crt); err != nil || !got.IsTerminal || got.Size != int64(len("cert v1")) || got.Modified.Sub(info.Modified).Abs() > time.Second {
		t.Fatalf("offline Stat = %+v, %v; want the stored file's size and time %s", got, err, info.Modified)
	}
	if !s2.Exists(ctx, crt) || s2.Exists(ctx, k.SiteCert(iss, "never.example.com")) {
		t.Fatal("offline Exists does not follow the local copy")
	}
	if list, err := s2.List(ctx, "certificates", true); err != nil || len(list) == 0 {
		t.Fatalf("offline List = %v, %v", list, err)
	}
	if s2.LocalReads() == 0 {
		t.Fatal("local reads were not counted")
	}
	// What the copy does not hold is not "missing": the store may have it.
	if _, err := s2.Load(ctx, k.SiteCert(iss, "never.example.com")); !store.HasCode(err, store.CodeStoreUnavailable) || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("offline Load of an unknown certificate: %v; want store_unavailable", err)
	}
	if _, err := s2.Load(ctx, account); !store.HasCode(err, store.CodeStoreUnavailable) {
		t.Fatalf("offline Load of the account key: %v; want store_unavailable", err)
	}
	// Writes and locks are refused at once: nothing is issued offline.
	start := time.Now()
	for name, err := range map[string]error{
		"Store":  s2.Store(ctx, crt, []byte("cert offline")),
		"Delete": s2.Delete(ctx, crt),
		"Lock":   s2.Lock(ctx, "issue_cert_new.example.com"),
		"TryLock": func() error {
			_, err := s2.TryLock(ctx, "issue_cert_new.example.com")
			return err
		}(),
	} {
		if !store.HasCode(err, store.CodeStoreUnavailable) {
			t.Fatalf("offline %s: %v; want store_unavailable", name, err)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refusing the offline writes took %s; a store never reached must be refused at once", took)
	}
	if s2.Refused() < 4 {
		t.Fatalf("refused writes counted %d, want 4", s2.Refused())
	}
	if got, _ := s2.Load(ctx, crt); string(got) != "cert v1" {
		t.Fatalf("a refused write changed the local copy: %q", got)
	}

	// The store comes back: the copy yields to it.
	storetest.StartIn(t, natsDir, addr)
	if _, err := l2.Wait(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 10*time.Second, "the local copy to take the renewed certificate", func() bool {
		b, err := os.ReadFile(filepath.Join(local, filepath.FromSlash(crt)))
		return err == nil && string(b) == "cert v2"
	})
	storetest.Eventually(t, 10*time.Second, "the local copy to drop the removed certificate", func() bool {
		_, err := os.Stat(filepath.Join(local, filepath.FromSlash(gone)))
		return errors.Is(err, fs.ErrNotExist)
	})
	if got, err := s2.Load(ctx, crt); err != nil || string(got) != "cert v2" {
		t.Fatalf("online Load = %q, %v; want the store's renewed certificate", got, err)
	}
	if err := s2.Lock(ctx, "issue_cert_shop.example.com"); err != nil {
		t.Fatalf("lock after the store returned: %v", err)
	}
	if err := s2.Unlock(ctx, "issue_cert_shop.example.com"); err != nil {
		t.Fatal(err)
	}
}

// Keys that would name a file outside the local copy are never copied.
func TestLocalCopyStaysInItsDirectory(t *testing.T) {
	srv := storetest.Start(t)
	root := t.TempDir()
	local := filepath.Join(root, "copy")
	s, err := certs.New(store.Bound(srv.Store), certs.Options{LocalDir: local})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range []string{"certificates/../../escaped", "certificates/./x/../../../escaped2", "ocsp/../escaped3"} {
		if err := s.Store(context.Background(), k, []byte("x")); err != nil && !errors.Is(err, certs.ErrInvalidKey) {
			t.Fatalf("Store(%q): %v", k, err)
		}
	}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if rel, _ := filepath.Rel(local, path); rel == "" || rel[0] == '.' {
				t.Errorf("file written outside the local copy: %s", path)
			}
		}
		return nil
	})
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustEncode(t *testing.T, key string) string {
	t.Helper()
	enc, err := certs.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}
