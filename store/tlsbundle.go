package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store/pki"
)

// The fleet's CA bundle in the store. Credentials carry the bundle as it
// was when they were issued; while the CA is rotated, storage nodes'
// certificates move to a new CA that those credentials do not know. So the
// control plane records the current bundle in the signers bucket, signed
// by the trust root like the signer certificates beside it, and every
// long-running client follows it (FollowTLSBundle): a bundle that verifies
// replaces the one it verifies storage nodes against, from its next
// connection on, and is kept beside its credentials (<file>.bundle) for
// its next start.

// TLSBundleKey is the signers bucket key of the fleet's CA bundle.
const TLSBundleKey = "tls.bundle"

// TLSBundleRecord is the fleet's CA bundle.
type TLSBundleRecord struct {
	Version int `json:"version"`
	// Generation counts the auth dir's CA changes (each step of a
	// rotation): a storage node started with an older copy of the auth
	// dir does not take the fleet back to an older bundle.
	Generation int `json:"generation"`
	// Bundle is every CA storage nodes' certificates may chain to, PEM.
	Bundle string `json:"bundle"`
	// Fingerprints are the CAs' SHA-256 (pki.Fingerprint), for people.
	Fingerprints []string  `json:"fingerprints"`
	At           time.Time `json:"at"`
}

func (r *TLSBundleRecord) version() int { return r.Version }

// PublishTLSBundle records bundlePEM, of the auth dir's CA generation, as
// the fleet's CA bundle, signed by root. The bundle the store holds stays
// when it is the same or of a later generation: published reports whether
// this one was written.
func (s *Store) PublishTLSBundle(ctx context.Context, root *signing.Key, bundlePEM []byte, generation int) (published bool, err error) {
	certs, err := pki.ParseCerts(bundlePEM)
	if err != nil || len(certs) == 0 {
		return false, Errorf(CodeInvalid, "a CA bundle needs at least one certificate (%v)", err)
	}
	cur, err := s.ReadTLSBundle(ctx)
	switch {
	case err == nil && (cur.Bundle == string(bundlePEM) || cur.Generation > generation):
		return false, nil
	case err == nil && cur.Generation == generation:
		return false, Errorf(CodeConflict, "the store holds another CA bundle of generation %d: two auth dirs disagree (copy the auth dir of the last `control tls rotate` to every storage node)", generation).
			With("generation", fmt.Sprint(generation))
	case err != nil && !HasCode(err, CodeNotFound):
		return false, err
	}
	rec := TLSBundleRecord{Version: RecordVersion, Generation: generation, Bundle: string(bundlePEM), At: time.Now().UTC()}
	for _, c := range certs {
		rec.Fingerprints = append(rec.Fingerprints, pki.Fingerprint(c))
	}
	data, err := json.Marshal(&rec)
	if err != nil {
		return false, err
	}
	if _, err := s.appendSigned(ctx, keyOf(root), "KV_"+s.Names.SignersBucket(), s.signersSubject(TLSBundleKey), "", data, ""); err != nil {
		return false, classify(fmt.Errorf("recording the fleet's CA bundle: %w", err))
	}
	return true, nil
}

// ReadTLSBundle reads the fleet's CA bundle as the trust root signed it.
func (s *Store) ReadTLSBundle(ctx context.Context) (*TLSBundleRecord, error) {
	t, _, err := s.Trust(ctx)
	if err != nil {
		return nil, err
	}
	var found *StoredMsg
	if err := s.LastOf(ctx, "KV_"+s.Names.SignersBucket(), []string{s.signersSubject(TLSBundleKey)}, func(m *StoredMsg) error {
		found = m
		return nil
	}); err != nil {
		return nil, err
	}
	if found == nil || found.Header.Get(kvOperationHeader) != "" {
		return nil, Errorf(CodeNotFound, "the store holds no CA bundle")
	}
	if err := t.VerifyRoot(signing.Message{Subject: found.Subject, Seq: found.Seq, Body: found.Data}, found.Header.Get(signing.Header)); err != nil {
		return nil, Errorf(CodeBadSignature, "the store's CA bundle: %w", err)
	}
	var rec TLSBundleRecord
	if err := Decode("CA bundle", found.Data, &rec); err != nil {
		return nil, err
	}
	if _, err := pki.ParseCerts([]byte(rec.Bundle)); err != nil {
		return nil, Errorf(CodeInvalid, "the store's CA bundle: %w", err)
	}
	return &rec, nil
}

// DefaultBundleFollow is how often FollowTLSBundle reads the bundle.
const DefaultBundleFollow = time.Minute

// FollowTLSBundle makes the connections of source (a credentials or CA
// file whose bundle this process verifies storage nodes against) follow
// the fleet's bundle in s: read now, then every interval (default
// DefaultBundleFollow), until ctx ends. A bundle that verifies under the
// trust root and differs from source's is used from the next connection on
// and written to source+".bundle". Errors go to report; following goes on.
func FollowTLSBundle(ctx context.Context, s *Store, source string, interval time.Duration, report func(error)) {
	if interval <= 0 {
		interval = DefaultBundleFollow
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := RefreshTLSBundle(ctx, s, source); err != nil && report != nil && ctx.Err() == nil {
			report(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RefreshTLSBundle reads the fleet's bundle in s once, as FollowTLSBundle
// does at each interval.
func RefreshTLSBundle(ctx context.Context, s *Store, source string) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec, err := s.ReadTLSBundle(rctx)
	if HasCode(err, CodeNotFound) {
		return nil // a fleet without TLS, or a store from before it
	}
	if err != nil {
		return err
	}
	trusts.Lock()
	tr := trusts.m[source]
	trusts.Unlock()
	if tr == nil {
		return nil // this process speaks no TLS with source
	}
	certs, _ := pki.ParseCerts([]byte(rec.Bundle))
	var norm []byte
	for _, c := range certs {
		norm = append(norm, pki.EncodeCert(c)...)
	}
	if tr.bundle() == string(norm) {
		return nil
	}
	tr.set(pki.Pool(certs), string(norm))
	if err := writeBundleFile(BundleFile(source), norm); err != nil {
		return fmt.Errorf("keeping the fleet's CA bundle beside %s (used until this process stops): %w", source, err)
	}
	return nil
}

// BundleFile is where the bundle followed for source is kept.
func BundleFile(source string) string { return source + ".bundle" }

func writeBundleFile(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
