package store_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The bucket cookie verifies only for the key, deploy and bucket it was
// signed for, in its one canonical form.
func TestCanaryBucketCookie(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	v := store.SignCanaryBucket(key, "d2", 42)
	if b, ok := store.CanaryBucketOf(key, "d2", v); !ok || b != 42 {
		t.Fatalf("a signed bucket: %d %v", b, ok)
	}
	other := bytes.Repeat([]byte{8}, 32)
	_, mac, _ := strings.Cut(v, ".")
	for name, c := range map[string]struct {
		key           []byte
		deploy, value string
	}{
		"unsigned":       {key, "d2", "42"},
		"another bucket": {key, "d2", "43." + mac},
		"another deploy": {key, "d3", v},
		"another key":    {other, "d2", v},
		"no key":         {nil, "d2", v},
		"leading zero":   {key, "d2", "042." + mac},
		"sign":           {key, "d2", "+42." + mac},
		"truncated mac":  {key, "d2", v[:len(v)-2]},
		"out of range":   {key, "d2", store.SignCanaryBucket(key, "d2", store.CanaryBuckets)},
		"negative":       {key, "d2", store.SignCanaryBucket(key, "d2", -1)},
		"padded mac":     {key, "d2", v + "=="},
		"empty":          {key, "d2", ""},
	} {
		if b, ok := store.CanaryBucketOf(c.key, c.deploy, c.value); ok {
			t.Errorf("%s (%q): accepted as bucket %d", name, c.value, b)
		}
	}
}

// The control plane makes the key once, with the store; later calls and
// other control servers get the same key.
func TestCanaryCookieKeyMadeOnce(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k1, err := srv.Store.CanaryCookieKeyOf(ctx)
	if err != nil || k1 == nil || len(k1.Key) != 32 {
		t.Fatalf("the key after provisioning: %+v %v", k1, err)
	}
	k2, err := srv.Connect(t).EnsureCanaryCookieKey(ctx)
	if err != nil || !bytes.Equal(k1.Key, k2.Key) {
		t.Fatalf("a second control server's key: %+v %v", k2, err)
	}
}

// What a gateway pays per sticky request with a cookie.
func BenchmarkCanaryBucketOf(b *testing.B) {
	key := bytes.Repeat([]byte{7}, 32)
	v := store.SignCanaryBucket(key, "20261127T073000-abcdef", 4242)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := store.CanaryBucketOf(key, "20261127T073000-abcdef", v); !ok {
			b.Fatal("not verified")
		}
	}
}
