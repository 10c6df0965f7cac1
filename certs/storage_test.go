package certs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func newStorage(t testing.TB, st *store.Store, o certs.Options) *certs.Storage {
	t.Helper()
	s, err := certs.New(store.Bound(st), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Keys as certmagic builds them (KeyBuilder and the ACME account paths), plus
// the awkward characters it can pass through from names and issuers.
func certmagicKeys() []string {
	k := certmagic.StorageKeys
	iss := "acme-v02.api.letsencrypt.org-directory"
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 57)
	return []string{
		k.SiteCert(iss, "shop.example.com"),
		k.SitePrivateKey(iss, "shop.example.com"),
		k.SiteMeta(iss, "shop.example.com"),
		k.SiteCert(iss, "*.example.com"),
		k.SiteCert(iss, "xn--bcher-kva.example"),
		k.SiteCert(iss, long),
		k.SiteCert("127.0.0.1:14000-dir", "10.0.0.1"),
		k.SiteCert(iss, "::1"),
		"acme/acme-v02.api.letsencrypt.org-directory/users/ops@example.com/ops.json",
		"acme/acme-v02.api.letsencrypt.org-directory/users/ops@example.com/ops.key",
		"acme/127.0.0.1_14000-dir/challenge_tokens/shop.example.com.json",
		"ocsp/shop.example.com-1a2b3c",
		"last_clean.json",
		"rw_test_8921374",
		"UPPER/Case/Key.JSON",
		"raw/bücher.例え.テスト", // raw UTF-8 a caller might pass
		"odd/a=b/c_d/e%20f/g+h/~tilde/!bang/$dollar/(paren)/'q'/\"dq\"/<lt>/`tick`/{brace}/|pipe|/\\bs",
		"dots/./../.../x..y/.hidden/trailing.",
		"space/a b/tab\tc/nl\nd",
		"wild/*/>/>x/*.y",
	}
}

func TestKeyEncodingRoundTripsEveryByte(t *testing.T) {
	var all []byte
	for c := 1; c < 256; c++ {
		if c != '/' {
			all = append(all, byte(c))
		}
	}
	keys := append(certmagicKeys(), "every/"+string(all), string(all)+"/x")
	for _, k := range keys {
		enc, err := certs.EncodeKey(k)
		if err != nil {
			t.Fatalf("encode %q: %v", k, err)
		}
		for _, c := range []byte(enc) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_=.", c) >= 0
			if !ok {
				t.Fatalf("encoded %q contains %q, not a KV key character: %q", k, c, enc)
			}
		}
		if strings.HasPrefix(enc, ".") || strings.HasSuffix(enc, ".") || strings.Contains(enc, "..") {
			t.Fatalf("encoded %q has an empty token: %q", k, enc)
		}
		if got := strings.Count(enc, ".") + 1; got != strings.Count(k, "/")+1 {
			t.Fatalf("encoded %q has %d tokens, want one per segment (%d)", k, got, strings.Count(k, "/")+1)
		}
		dec, err := certs.DecodeKey(enc)
		if err != nil {
			t.Fatalf("decode %q: %v", enc, err)
		}
		canon, _ := certs.CanonicalKey(k)
		if dec != canon {
			t.Fatalf("round trip %q -> %q -> %q, want %q", k, enc, dec, canon)
		}
	}
}

func TestKeyEncodingRejectsBadKeys(t *testing.T) {
	for _, k := range []string{"", "/", "a//b", "/a", "a/", strings.Repeat("_", 1200)} {
		_, err := certs.EncodeKey(k)
		if !errors.Is(err, certs.ErrInvalidKey) {
			t.Errorf("EncodeKey(%q) = %v, want ErrInvalidKey", truncate(k), err)
		}
	}
	for _, enc := range []string{"", "a_4", "a_zz", "a_4G"} {
		if _, err := certs.DecodeKey(enc); err == nil {
			t.Errorf("DecodeKey(%q) succeeded, want an error", enc)
		}
	}
}

func truncate(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

func TestNormalizeHost(t *testing.T) {
	cases := map[string]string{
		"Shop.example.com.":           "shop.example.com",
		"shop.example.com":            "shop.example.com",
		" SHOP.Example.COM ":          "shop.example.com",
		"*.Example.com.":              "*.example.com",
		"Bücher.example":              "xn--bcher-kva.example",
		"xn--bcher-kva.example":       "xn--bcher-kva.example",
		"ＳＨＯＰ.example.com":            "shop.example.com", // full-width, mapped by UTS 46
		"_acme-challenge.Example.com": "_acme-challenge.example.com",
		"2001:DB8::1":                 "2001:db8::1",
		"[::1]":                       "::1",
		"10.0.0.1":                    "10.0.0.1",
		"Ops@Example.com":             "ops@example.com",
	}
	for in, want := range cases {
		got, err := certs.NormalizeHost(in)
		if err != nil || got != want {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", " ", ".", "a..b", ".a", "a.b..", strings.Repeat("a.", 130) + "com"} {
		if got, err := certs.NormalizeHost(bad); err == nil {
			t.Errorf("NormalizeHost(%q) = %q, want an error", bad, got)
		}
	}
}

func TestLockKeyMapsCertmagicNames(t *testing.T) {
	cases := map[string]string{
		"issue_cert_Shop.example.com.":          store.CertLockKey("shop.example.com"),
		"issue_cert_shop.example.com":           store.CertLockKey("shop.example.com"),
		"issue_cert_Bücher.example":             store.CertLockKey("xn--bcher-kva.example"),
		"issue_cert_*.example.com":              store.CertLockKey("*.example.com"),
		"register_acme_account_Ops@example.com": store.AcmeAccountLockKey("ops@example.com"),
		"register_acme_account":                 store.AcmeAccountLockKey("default"),
		"storage_clean":                         "cp.lock.certmagic.storage_5fclean",
	}
	for in, want := range cases {
		if got := certs.LockKey(in); got != want {
			t.Errorf("LockKey(%q) = %q, want %q", in, got, want)
		}
	}
	// Every lock key must be a valid KV key.
	srv := storetest.Start(t)
	for in := range cases {
		if _, err := storetest.Bucket(t, srv.Store, srv.Store.Names.LocksBucket()).Put(context.Background(), certs.LockKey(in), []byte("x")); err != nil {
			t.Errorf("lock key for %q rejected by KV: %v", in, err)
		}
	}
}

// TestStorageConformance runs every certmagic.Storage method against a real
// embedded NATS server.
func TestStorageConformance(t *testing.T) {
	srv := storetest.Start(t)
	s := newStorage(t, srv.Store, certs.Options{})
	ctx := context.Background()

	t.Run("missing keys are fs.ErrNotExist", func(t *testing.T) {
		if _, err := s.Load(ctx, "no/such/key"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Load: %v", err)
		}
		if _, err := s.Stat(ctx, "no/such/key"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Stat: %v", err)
		}
		if _, err := s.List(ctx, "no/such", true); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("List: %v", err)
		}
		if s.Exists(ctx, "no/such/key") {
			t.Fatal("Exists: true for a missing key")
		}
		if err := s.Delete(ctx, "no/such/key"); err != nil {
			t.Fatalf("Delete of a missing key: %v", err)
		}
	})

	t.Run("every certmagic key stores, loads, stats, lists and deletes", func(t *testing.T) {
		for i, k := range certmagicKeys() {
			val := []byte(fmt.Sprintf("value %d of %q", i, k))
			if err := s.Store(ctx, k, val); err != nil {
				t.Fatalf("Store(%q): %v", k, err)
			}
			got, err := s.Load(ctx, k)
			if err != nil || !bytes.Equal(got, val) {
				t.Fatalf("Load(%q) = %q, %v", k, got, err)
			}
			if !s.Exists(ctx, k) {
				t.Fatalf("Exists(%q) = false", k)
			}
			canon, _ := certs.CanonicalKey(k)
			info, err := s.Stat(ctx, k)
			if err != nil || info.Key != canon || !info.IsTerminal || info.Size != int64(len(val)) || time.Since(info.Modified) > time.Minute {
				t.Fatalf("Stat(%q) = %+v, %v", k, info, err)
			}
			parent := canon[:max(strings.LastIndex(canon, "/"), 0)]
			if parent != "" {
				list, err := s.List(ctx, parent, false)
				if err != nil || !contains(list, canon) {
					t.Fatalf("List(%q) = %q, %v; want it to hold %q", parent, list, err, canon)
				}
				dir, err := s.Stat(ctx, parent)
				if err != nil || dir.IsTerminal || !s.Exists(ctx, parent) {
					t.Fatalf("Stat(%q) = %+v, %v; want a directory", parent, dir, err)
				}
			}
		}
		for _, k := range certmagicKeys() {
			if err := s.Delete(ctx, k); err != nil {
				t.Fatalf("Delete(%q): %v", k, err)
			}
			if _, err := s.Load(ctx, k); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Load(%q) after delete: %v", k, err)
			}
		}
	})

	t.Run("overwrite and empty value", func(t *testing.T) {
		mustStore(t, s, "ow/key", "one")
		mustStore(t, s, "ow/key", "two")
		if got, _ := s.Load(ctx, "ow/key"); string(got) != "two" {
			t.Fatalf("after overwrite: %q", got)
		}
		mustStore(t, s, "ow/empty", "")
		got, err := s.Load(ctx, "ow/empty")
		if err != nil || len(got) != 0 {
			t.Fatalf("empty value: %q, %v", got, err)
		}
	})

	t.Run("list semantics", func(t *testing.T) {
		for _, k := range []string{"ls/a", "ls/b/c", "ls/b/d/e", "ls/bb", "lsx/nope", "ls/b/d/f"} {
			mustStore(t, s, k, k)
		}
		got, err := s.List(ctx, "ls", false)
		if err != nil || !reflect.DeepEqual(got, []string{"ls/a", "ls/b", "ls/bb"}) {
			t.Fatalf("List(ls, false) = %q, %v", got, err)
		}
		got, err = s.List(ctx, "ls", true)
		want := []string{"ls/a", "ls/b", "ls/b/c", "ls/b/d", "ls/b/d/e", "ls/b/d/f", "ls/bb"}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("List(ls, true) = %q, %v; want %q", got, err, want)
		}
		got, err = s.List(ctx, "ls/b/d", false)
		if err != nil || !reflect.DeepEqual(got, []string{"ls/b/d/e", "ls/b/d/f"}) {
			t.Fatalf("List(ls/b/d, false) = %q, %v", got, err)
		}
		// "l" is not a prefix of "ls/...": prefixes are whole segments.
		if got, err := s.List(ctx, "l", true); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("List(l) = %q, %v; want ErrNotExist", got, err)
		}
		root, err := s.List(ctx, "", false)
		if err != nil || !contains(root, "ls") || !contains(root, "lsx") || contains(root, "ls/a") {
			t.Fatalf("List(root, false) = %q, %v", root, err)
		}
		// Deleting a directory deletes everything under it, nothing beside it.
		if err := s.Delete(ctx, "ls/b"); err != nil {
			t.Fatal(err)
		}
		got, err = s.List(ctx, "ls", true)
		if err != nil || !reflect.DeepEqual(got, []string{"ls/a", "ls/bb"}) {
			t.Fatalf("after Delete(ls/b): %q, %v", got, err)
		}
		if s.Exists(ctx, "ls/b") {
			t.Fatal("ls/b exists after delete")
		}
	})

	t.Run("one certificate, many spellings", func(t *testing.T) {
		iss := "acme.example-directory"
		dotted := certmagic.StorageKeys.SiteCert(iss, "shop.example.com.")
		plain := certmagic.StorageKeys.SiteCert(iss, "shop.example.com")
		mustStore(t, s, dotted, "pem")
		if got, err := s.Load(ctx, plain); err != nil || string(got) != "pem" {
			t.Fatalf("load under the plain spelling: %q, %v", got, err)
		}
		list, _ := s.List(ctx, certmagic.StorageKeys.CertsPrefix(iss), true)
		if !contains(list, plain) || len(list) != 2 {
			t.Fatalf("list = %q, want the canonical key only", list)
		}
		mustStore(t, s, "acme/ca/challenge_tokens/shop.example.com..json", "tok")
		if got, _ := s.Load(ctx, "acme/ca/challenge_tokens/shop.example.com.json"); string(got) != "tok" {
			t.Fatalf("challenge token under the plain spelling: %q", got)
		}
	})

	t.Run("bad keys fail clearly and store nothing", func(t *testing.T) {
		for _, k := range []string{"", "a//b", "/lead", "trail/"} {
			if err := s.Store(ctx, k, []byte("x")); !errors.Is(err, certs.ErrInvalidKey) {
				t.Fatalf("Store(%q) = %v, want ErrInvalidKey", k, err)
			}
			if _, err := s.Load(ctx, k); !errors.Is(err, certs.ErrInvalidKey) {
				t.Fatalf("Load(%q) = %v", k, err)
			}
		}
		if err := s.Store(ctx, "long/"+strings.Repeat("x", 5000), []byte("x")); !errors.Is(err, certs.ErrInvalidKey) {
			t.Fatalf("Store(very long key) = %v, want ErrInvalidKey", err)
		}
		longOK := "long/" + strings.Repeat("y", 2500)
		mustStore(t, s, longOK, "fits")
		if got, _ := s.Load(ctx, longOK); string(got) != "fits" {
			t.Fatalf("2.5 KB key: %q", got)
		}
	})

	t.Run("values up to the max payload, a clear error beyond", func(t *testing.T) {
		max := s.MaxValueSize()
		if max != store.MaxCertValue {
			t.Fatalf("max value %d, want the certificates bucket's %d", max, store.MaxCertValue)
		}
		big := bytes.Repeat([]byte{0xab}, max)
		if err := s.Store(ctx, "big/exact", big); err != nil {
			t.Fatalf("storing exactly the max payload: %v", err)
		}
		got, err := s.Load(ctx, "big/exact")
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("loading the max payload: %d bytes, %v", len(got), err)
		}
		mustStore(t, s, "big/over", "previous")
		err = s.Store(ctx, "big/over", append(big, 0))
		se := store.AsError(err)
		if se == nil || se.Code != store.CodeInvalid || se.Detail["max"] != fmt.Sprint(max) {
			t.Fatalf("storing max+1 bytes: %v, want a structured invalid error naming the max", err)
		}
		if got, _ := s.Load(ctx, "big/over"); string(got) != "previous" {
			t.Fatalf("the refused write lost the previous value: %q", got)
		}
	})

	t.Run("concurrent writers", func(t *testing.T) {
		other := newStorage(t, srv.Connect(t), certs.Options{})
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for w := 0; w < 8; w++ {
			st := s
			if w%2 == 1 {
				st = other
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					v := bytes.Repeat([]byte{byte('a' + w)}, 4096)
					if err := st.Store(ctx, "race/shared", v); err != nil {
						errs <- err
						return
					}
					if err := st.Store(ctx, fmt.Sprintf("race/w%d/%d", w, i), v); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got, err := s.Load(ctx, "race/shared")
		if err != nil || len(got) != 4096 || !bytes.Equal(got, bytes.Repeat(got[:1], 4096)) {
			t.Fatalf("shared value torn or lost: %d bytes, %v", len(got), err)
		}
		all, err := other.List(ctx, "race", true)
		if err != nil || len(all) != 1+8+8*25 {
			t.Fatalf("listed %d keys, want %d: %v", len(all), 1+8+8*25, err)
		}
	})

	t.Run("context is honoured", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.Store(cctx, "ctx/k", []byte("x")); err == nil {
			t.Fatal("Store with a cancelled context succeeded")
		}
		if _, err := s.List(cctx, "race", true); err == nil {
			t.Fatal("List with a cancelled context succeeded")
		}
	})
}

func mustStore(t *testing.T, s *certs.Storage, k, v string) {
	t.Helper()
	if err := s.Store(context.Background(), k, []byte(v)); err != nil {
		t.Fatalf("Store(%q): %v", k, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
