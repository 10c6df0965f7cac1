package signing_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeplane/edgeplane/signing"
)

func keys(t testing.TB) (root, signer *signing.Key, trust *signing.Trust) {
	t.Helper()
	root, err := signing.NewRoot()
	if err != nil {
		t.Fatal(err)
	}
	signer, err = signing.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	trust, err = signing.NewTrust(root.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.SetSigner(signer.PublicKey(), nil); err != nil {
		t.Fatal(err)
	}
	return root, signer, trust
}

func TestVerifyRefusesWhatWasNotSignedSo(t *testing.T) {
	root, signer, trust := keys(t)
	m := signing.Message{Subject: "cp.default.routing.svc.shop.web", Seq: 7, Body: []byte(`{"kind":"service.upsert"}`)}
	h := signer.Sign(m)
	if _, err := trust.Verify("routing", m, h); err != nil {
		t.Fatalf("good signature refused: %v", err)
	}
	stranger, _ := signing.NewSigner()
	for _, tc := range []struct {
		name   string
		m      signing.Message
		h      string
		reason string
	}{
		{"no header", m, "", signing.ReasonUnsigned},
		{"garbage header", m, "v1 x", signing.ReasonMalformed},
		{"other version", m, "v2" + h[2:], signing.ReasonMalformed},
		{"copied to another sequence", signing.Message{Subject: m.Subject, Seq: 8, Body: m.Body}, h, signing.ReasonReplayed},
		{"copied to another subject", signing.Message{Subject: "cp.default.routing.svc.bank.web", Seq: 7, Body: m.Body}, h, signing.ReasonBadSignature},
		{"body changed", signing.Message{Subject: m.Subject, Seq: 7, Body: []byte(`{"kind":"service.remove"}`)}, h, signing.ReasonBadSignature},
		{"put passed off as a delete", signing.Message{Subject: m.Subject, Seq: 7, Op: "DEL", Body: m.Body}, h, signing.ReasonBadSignature},
		{"signer never certified", m, stranger.Sign(m), signing.ReasonUnknown},
		{"signed by the root, not a signer", m, root.Sign(m), signing.ReasonUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := trust.Verify("routing", tc.m, tc.h)
			if got := signing.Reason(err); got != tc.reason {
				t.Fatalf("got %q (%v), want %q", got, err, tc.reason)
			}
		})
	}
}

func TestRetiredSignerStandsForWhatItSignedBefore(t *testing.T) {
	_, signer, trust := keys(t)
	if err := trust.SetSigner(signer.PublicKey(), signing.Bounds{"routing": 10}); err != nil {
		t.Fatal(err)
	}
	before := signing.Message{Subject: "s", Seq: 10, Body: []byte("x")}
	after := signing.Message{Subject: "s", Seq: 11, Body: []byte("x")}
	if _, err := trust.Verify("routing", before, signer.Sign(before)); err != nil {
		t.Fatalf("signed before retirement: %v", err)
	}
	if _, err := trust.Verify("routing", after, signer.Sign(after)); signing.Reason(err) != signing.ReasonRetired {
		t.Fatalf("signed after retirement: got %v, want %s", err, signing.ReasonRetired)
	}
	if _, err := trust.Verify("commits", before, signer.Sign(before)); signing.Reason(err) != signing.ReasonRetired {
		t.Fatalf("a stream the retirement does not name: got %v, want %s", err, signing.ReasonRetired)
	}
	// A seal made before the retirement vouches for no event after it.
	if err := trust.Vouches("routing", signer.PublicKey(), 10); err != nil {
		t.Fatalf("vouching up to the retirement: %v", err)
	}
	if err := trust.Vouches("routing", signer.PublicKey(), 11); signing.Reason(err) != signing.ReasonRetired {
		t.Fatalf("vouching past the retirement: got %v, want %s", err, signing.ReasonRetired)
	}
	stranger, _ := signing.NewSigner()
	if err := trust.Vouches("routing", stranger.PublicKey(), 1); signing.Reason(err) != signing.ReasonUnknown {
		t.Fatalf("vouching by an unknown signer: got %v, want %s", err, signing.ReasonUnknown)
	}
}

// A digest covers what a signature covers: subject, sequence, operation
// and body.
func TestDigestCoversWhatASignatureCovers(t *testing.T) {
	m := signing.Message{Subject: "s", Seq: 7, Body: []byte("x")}
	d := m.Digest()
	for _, other := range []signing.Message{
		{Subject: "t", Seq: 7, Body: []byte("x")},
		{Subject: "s", Seq: 8, Body: []byte("x")},
		{Subject: "s", Seq: 7, Op: "DEL", Body: []byte("x")},
		{Subject: "s", Seq: 7, Body: []byte("y")},
	} {
		if other.Digest() == d {
			t.Fatalf("%+v has the digest of %+v", other, m)
		}
	}
	if again := m; again.Digest() != d {
		t.Fatal("a digest is not stable")
	}
}

func TestRootSignsOnlyAsRoot(t *testing.T) {
	root, signer, trust := keys(t)
	m := signing.Message{Subject: "$KV.cp_signers_default.signer.N", Seq: 3, Body: []byte("{}")}
	if err := trust.VerifyRoot(m, root.Sign(m)); err != nil {
		t.Fatalf("root signature refused: %v", err)
	}
	if err := trust.VerifyRoot(m, signer.Sign(m)); signing.Reason(err) != signing.ReasonUnknown {
		t.Fatalf("a signer passed for the root: %v", err)
	}
}

func TestKeyFileFollowsRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "signer.nk")
	a, _ := signing.NewSigner()
	if err := signing.WriteKeyFile(path, a); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}
	f, err := signing.OpenKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := f.SigningKey(); k.PublicKey() != a.PublicKey() {
		t.Fatal("wrong key")
	}
	b, _ := signing.NewSigner()
	if err := signing.WriteKeyFile(path, b); err != nil {
		t.Fatal(err)
	}
	if k, err := f.SigningKey(); err != nil || k.PublicKey() != b.PublicKey() {
		t.Fatalf("after rotation: %v %v, want %s", k, err, b.PublicKey())
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := signing.NewSigner()
	if err := signing.WriteKeyFile(path, c); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SigningKey(); err == nil {
		t.Fatal("a world-readable key file was used")
	}
	root, _ := signing.NewRoot()
	if err := signing.WriteKeyFile(path, root); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SigningKey(); err == nil {
		t.Fatal("the trust root was used as a signer")
	}
}

func TestLoadOrCreateRootKeepsTheRoot(t *testing.T) {
	dir := t.TempDir()
	if k, err := signing.LoadRoot(dir); k != nil || err != nil {
		t.Fatalf("empty dir: %v %v", k, err)
	}
	k1, created, err := signing.LoadOrCreateRoot(dir)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	k2, created, err := signing.LoadOrCreateRoot(dir)
	if err != nil || created || k2.PublicKey() != k1.PublicKey() {
		t.Fatalf("reload: %v %v", created, err)
	}
	if _, err := signing.NewTrust(k1.PublicKey()); err != nil {
		t.Fatal(err)
	}
	s, _ := signing.NewSigner()
	if _, err := signing.NewTrust(s.PublicKey()); err == nil {
		t.Fatal("a signer key accepted as a trust root")
	}
}

// routingBody is about the size of a routing event of one service with two
// routes and two endpoints.
var routingBody = []byte(`{"version":1,"kind":"service.upsert","namespace":"shop","service":"web","deploy_id":"shop-r7","revision":7,` +
	`"routes":[{"hosts":["web.shop.example.com","*.web.shop.example.com"]}],` +
	`"endpoints":[{"instance_id":"i1","address":"10.100.0.1","port":8000},{"instance_id":"i2","address":"10.100.0.2","port":8000}]}`)

// BenchmarkSign is what the control plane spends on one routing event.
func BenchmarkSign(b *testing.B) {
	_, signer, _ := keys(b)
	m := signing.Message{Subject: "cp.default.routing.svc.shop.web", Seq: 7, Body: routingBody}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m.Seq = uint64(i)
		_ = signer.Sign(m)
	}
}

// BenchmarkVerify is what a reader spends on one routing event's signature,
// on one core.
func BenchmarkVerify(b *testing.B) {
	_, signer, trust := keys(b)
	m := signing.Message{Subject: "cp.default.routing.svc.shop.web", Seq: 7, Body: routingBody}
	h := signer.Sign(m)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := trust.Verify("routing", m, h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyParallel is BenchmarkVerify on every core (-cpu N): what
// the projection's verification of a batch can reach.
func BenchmarkVerifyParallel(b *testing.B) {
	_, signer, trust := keys(b)
	m := signing.Message{Subject: "cp.default.routing.svc.shop.web", Seq: 7, Body: routingBody}
	h := signer.Sign(m)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := trust.Verify("routing", m, h); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
