// Package signers manages the control plane's signing keys: the trust root
// in a storage node's auth dir, the signer every control server signs
// intent with (DATA/signer.nk), the signers operators issue for their CLI,
// and their rotation and retirement (package signing says what a signature
// covers).
package signers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
)

// SignerFile is a control server's signer, in its data dir. The CLI on the
// same box signs with it too (--signing-key).
const SignerFile = "signer.nk"

// DefaultGrace is how long a rotation keeps the old signer valid after the
// new one is in place, so that appends signed just before the switch land
// while it still verifies.
const DefaultGrace = 2 * time.Second

// Setup is what a control server signs and verifies with.
type Setup struct {
	// Root is nil on a server whose auth dir holds no trust root: it signs
	// with a signer certified elsewhere and cannot certify one.
	Root   *signing.Key
	Signer *signing.KeyFile
	Trust  *signing.Trust
	// Created says the server's signer was created (and certified) now.
	Created bool
}

// Server prepares a control server's signing on s: the trust root from
// authDir (created there for a store that names none yet, and recorded in
// the store), and the signer in dataDir (created and certified by the root
// when missing, replaced when it was retired). s signs and verifies with
// them from then on.
func Server(ctx context.Context, s *store.Store, authDir, dataDir, name string) (*Setup, error) {
	root, err := signing.LoadRoot(authDir)
	if err != nil {
		return nil, err
	}
	storeRoot, err := s.ReadTrustRoot(ctx)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		return nil, err
	}
	if root == nil && storeRoot == "" {
		if root, _, err = signing.LoadOrCreateRoot(authDir); err != nil {
			return nil, err
		}
	}
	if root != nil {
		if err := s.PublishTrustRoot(ctx, root); err != nil {
			return nil, err
		}
		storeRoot = root.PublicKey()
	}
	trust, err := signing.NewTrust(storeRoot)
	if err != nil {
		return nil, err
	}
	source := store.TrustFromRootKey
	if root == nil {
		source = store.TrustFromFirstUse
	}
	s.TrustWith(trust, source)

	setup := &Setup{Root: root, Trust: trust}
	path := filepath.Join(dataDir, SignerFile)
	key, err := signing.ReadKeyFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if root == nil {
			return nil, noRoot(authDir, path)
		}
		if key, err = Issue(ctx, s, root, name, path); err != nil {
			return nil, err
		}
		setup.Created = true
	case err != nil:
		return nil, err
	}
	rec, err := find(ctx, s, key.PublicKey())
	if err != nil {
		return nil, err
	}
	switch {
	case rec == nil && root == nil, rec != nil && rec.Retired != nil && root == nil:
		return nil, noRoot(authDir, path)
	case rec == nil:
		// A key file whose certificate never landed (a crash in between).
		if err := Certify(ctx, s, root, store.SignerRecord{Key: key.PublicKey(), Name: name, IssuedAt: time.Now().UTC()}); err != nil {
			return nil, err
		}
	case rec.Retired != nil:
		if _, err = Issue(ctx, s, root, name, path); err != nil {
			return nil, err
		}
		setup.Created = true
	}
	if setup.Signer, err = signing.OpenKeyFile(path); err != nil {
		return nil, err
	}
	s.SignWith(setup.Signer)
	return setup, nil
}

func noRoot(authDir, signer string) error {
	return store.Errorf(store.CodeNotFound, "this server has no certified signer (%s) and its auth dir %s holds no trust root to certify one: copy %s from a storage node of this store, or put a signer from `control signing issue` there",
		signer, authDir, signing.RootFile).With("auth_dir", authDir).With("signer", signer)
}

// find returns signer pub's certificate, nil if it has none.
func find(ctx context.Context, s *store.Store, pub string) (*store.SignerRecord, error) {
	recs, _, err := s.ListSigners(ctx)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		if recs[i].Key == pub {
			return &recs[i], nil
		}
	}
	return nil, nil
}

// Issue creates a signer named name, certifies it with root, and writes its
// key to path (mode 0600). The certificate lands before the file, so a key
// file always names a signer readers can learn.
func Issue(ctx context.Context, s *store.Store, root *signing.Key, name, path string) (*signing.Key, error) {
	key, err := signing.NewSigner()
	if err != nil {
		return nil, err
	}
	if err := Certify(ctx, s, root, store.SignerRecord{Key: key.PublicKey(), Name: name, IssuedAt: time.Now().UTC()}); err != nil {
		return nil, err
	}
	if path != "-" {
		if err := signing.WriteKeyFile(path, key); err != nil {
			return nil, err
		}
	}
	return key, nil
}

// Rotation is what Rotate did.
type Rotation struct {
	Old     string              `json:"old"`
	New     string              `json:"new"`
	Retired *store.SignerRecord `json:"retired"`
}

// Rotate replaces the signer whose key file is path: a new signer is
// certified and written in its place, every process signing with the file
// (KeyFile) switches at its next signature, and after grace the old signer
// is retired: what it signed until then stays valid, nothing it signs later
// is. No signature is lost: an append signed with the old key retries with
// the new one if the stream moved on.
func Rotate(ctx context.Context, s *store.Store, root *signing.Key, path, name string, grace time.Duration) (*Rotation, error) {
	old, err := signing.ReadKeyFile(path)
	if err != nil {
		return nil, err
	}
	if name == "" {
		if rec, err := find(ctx, s, old.PublicKey()); err == nil && rec != nil {
			name = rec.Name
		}
	}
	fresh, err := Issue(ctx, s, root, name, path)
	if err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(grace):
	}
	rec, err := Retire(ctx, s, root, old.PublicKey())
	if err != nil {
		return nil, fmt.Errorf("retiring %s (the new signer %s is in place): %w", old.PublicKey(), fresh.PublicKey(), err)
	}
	return &Rotation{Old: old.PublicKey(), New: fresh.PublicKey(), Retired: rec}, nil
}

// List returns every signer certificate the root signed, active first, and
// what does not verify.
func List(ctx context.Context, s *store.Store) ([]store.SignerRecord, []error, error) {
	recs, bad, err := s.ListSigners(ctx)
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(recs, func(i, j int) bool {
		if (recs[i].Retired == nil) != (recs[j].Retired == nil) {
			return recs[i].Retired == nil
		}
		return recs[i].IssuedAt.Before(recs[j].IssuedAt)
	})
	return recs, bad, nil
}

// RootFrom reads the trust root a command needs to certify or retire:
// from authDir, else DATA/auth.
func RootFrom(authDir, dataDir string) (*signing.Key, error) {
	dir := authDir
	if dir == "" {
		if dataDir == "" {
			return nil, store.Errorf(store.CodeInvalid, "--data DIR or --auth-dir DIR is required: the trust root lives in a storage node's auth dir")
		}
		dir = filepath.Join(dataDir, "auth")
	}
	root, err := signing.LoadRoot(dir)
	if err != nil {
		return nil, err
	}
	if root == nil {
		if _, err := os.Stat(dir); err != nil {
			return nil, store.Errorf(store.CodeNotFound, "no auth dir %s: run this on a storage node (--data DIR, --auth-dir DIR)", dir).With("auth_dir", dir)
		}
		return nil, store.Errorf(store.CodeNotFound, "auth dir %s holds no trust root (%s)", dir, signing.RootFile).With("auth_dir", dir)
	}
	return root, nil
}

// Adopt certifies, under root, every signer that from's trust root
// certified, retired at from's current sequences: the signatures of a store
// copied from from (sequences kept) verify under root as they did there,
// and those keys sign nothing new. from is a stopped box's store, opened
// with its own trust. It returns the keys adopted.
func Adopt(ctx context.Context, from, to *store.Store, root *signing.Key, note string) ([]string, error) {
	recs, _, err := from.ListSigners(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the signers to carry over: %w", err)
	}
	bounds := signing.Bounds{}
	for _, stream := range from.Names.SigningStreams() {
		str, err := from.JS.Stream(ctx, stream)
		if err != nil {
			return nil, store.Classify(fmt.Errorf("reading %s: %w", stream, err))
		}
		bounds[stream] = str.CachedInfo().State.LastSeq
	}
	now := time.Now().UTC()
	var adopted []string
	for _, rec := range recs {
		if rec.Retired == nil {
			rec.Retired, rec.RetiredAt = bounds, &now
		}
		rec.Name += " (" + note + ")"
		if err := Certify(ctx, to, root, rec); err != nil {
			return adopted, err
		}
		adopted = append(adopted, rec.Key)
	}
	return adopted, nil
}

// Certify records rec, a certificate for a signer's server key (N...),
// signed by root: from then on what that key signs verifies under root.
func Certify(ctx context.Context, s *store.Store, root *signing.Key, rec store.SignerRecord) error {
	if !signing.IsSignerKey(rec.Key) {
		return store.Errorf(store.CodeInvalid, "signer %q is not a server public key (N...)", rec.Key).With("signer", rec.Key)
	}
	return s.PutSignerRecord(ctx, root, rec)
}

// Retire marks signer pub retired: its signatures stand for what each
// signed stream holds now, and for nothing appended later. Retiring a
// retired signer changes nothing.
func Retire(ctx context.Context, s *store.Store, root *signing.Key, pub string) (*store.SignerRecord, error) {
	recs, _, err := s.ListSigners(ctx)
	if err != nil {
		return nil, err
	}
	var rec *store.SignerRecord
	for i := range recs {
		if recs[i].Key == pub {
			rec = &recs[i]
		}
	}
	if rec == nil {
		return nil, store.Errorf(store.CodeNotFound, "no signer %s", pub).With("signer", pub)
	}
	if rec.Retired != nil {
		return rec, nil
	}
	bounds := signing.Bounds{}
	for _, stream := range s.Names.SigningStreams() {
		str, err := s.JS.Stream(ctx, stream)
		if err != nil {
			return nil, store.Classify(fmt.Errorf("retiring signer %s: %w", pub, err))
		}
		bounds[stream] = str.CachedInfo().State.LastSeq
	}
	now := time.Now().UTC()
	rec.Retired, rec.RetiredAt = bounds, &now
	if err := Certify(ctx, s, root, *rec); err != nil {
		return nil, err
	}
	return rec, nil
}
