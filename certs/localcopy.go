package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// localCopy is a gateway's own copy of the certificate assets it has
// loaded or stored: certificates, private keys, their metadata and OCSP
// staples, in a certmagic FileStorage (files 0600 in directories 0700),
// under their canonical keys. It answers reads while the store is
// unreachable, so a gateway that boots during an outage still serves the
// certificates it held. It never answers while the store does: the store
// is the truth, and follow brings the copy in line with it.
//
// ACME accounts, challenge tokens and locks are not copied: nothing that
// works offline needs them. A nil *localCopy holds nothing.
type localCopy struct {
	fs *certmagic.FileStorage
	// mu orders the copy's writes with follow's check of a file, so that
	// follow neither removes a file being written (FileStorage writes a
	// temporary file and renames it) nor puts back an older value over
	// one just stored.
	mu sync.Mutex
}

// followFile brings one file in line with st and reports whether it
// changed.
func (c *localCopy) followFile(ctx context.Context, st *store.Store, key string) (bool, error) {
	enc, err := EncodeKey(key)
	if err != nil || !fileSafe(key) {
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	info, err := c.fs.Stat(ctx, key)
	if err != nil || !info.IsTerminal {
		return false, nil // gone meanwhile, or a directory
	}
	ent, err := st.GetCert(ctx, enc)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		_ = c.fs.Delete(ctx, key)
		return true, nil
	case err != nil:
		return false, store.Classify(fmt.Errorf("reading %s: %w", key, err))
	}
	if old, _ := c.fs.Load(ctx, key); bytes.Equal(old, ent.Value()) {
		return false, nil
	}
	c.write(ctx, key, ent.Value(), ent.Created())
	return true, nil
}

// certificateName is the name a certificate file's key is for
// ("certificates/<issuer>/<name>/<name>.crt"), or "".
func certificateName(key string) string {
	segs := strings.Split(key, "/")
	if len(segs) == 4 && segs[0] == "certificates" && segs[3] == segs[2]+".crt" {
		return segs[2]
	}
	return ""
}

// copied reports whether a key (canonical) is one the local copy keeps:
// certmagic's certificate assets ("certificates/<issuer>/<name>/...") and
// OCSP staples ("ocsp/...").
func copied(canon string) bool {
	return strings.HasPrefix(canon, "certificates/") || strings.HasPrefix(canon, "ocsp/")
}

// canonical maps key to the local copy's key, or "" for a key it does not
// keep.
func (c *localCopy) canonical(key string) string {
	if c == nil {
		return ""
	}
	canon, err := CanonicalKey(key)
	if err != nil || !copied(canon) || !fileSafe(canon) {
		return ""
	}
	return canon
}

// fileSafe reports whether a canonical key names a file inside the local
// copy's directory: no "." or ".." segment can walk out of it, and no NUL
// can cut the name short.
func fileSafe(canon string) bool {
	for _, seg := range strings.Split(canon, "/") {
		if seg == "." || seg == ".." || strings.ContainsRune(seg, 0) {
			return false
		}
	}
	return true
}

// keep records value as key's content, last modified at modified (the
// store's time, so that Stat answers the same offline).
func (c *localCopy) keep(ctx context.Context, key string, value []byte, modified time.Time) {
	canon := c.canonical(key)
	if canon == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.write(ctx, canon, value, modified)
}

func (c *localCopy) write(ctx context.Context, canon string, value []byte, modified time.Time) {
	// A copy that cannot be written costs only offline service; the store
	// already has the value.
	if err := c.fs.Store(ctx, canon, value); err == nil && !modified.IsZero() {
		_ = os.Chtimes(c.fs.Filename(canon), modified, modified)
	}
}

// forget drops key (and anything under it) from the copy.
func (c *localCopy) forget(ctx context.Context, key string) {
	if canon := c.canonical(key); canon != "" {
		c.mu.Lock()
		defer c.mu.Unlock()
		_ = c.fs.Delete(ctx, canon)
	}
}

func (c *localCopy) load(ctx context.Context, key string) ([]byte, bool) {
	canon := c.canonical(key)
	if canon == "" {
		return nil, false
	}
	v, err := c.fs.Load(ctx, canon)
	return v, err == nil
}

func (c *localCopy) stat(ctx context.Context, key string) (certmagic.KeyInfo, bool) {
	canon := c.canonical(key)
	if canon == "" {
		return certmagic.KeyInfo{}, false
	}
	info, err := c.fs.Stat(ctx, canon)
	if err != nil {
		return certmagic.KeyInfo{}, false
	}
	info.Key = canon
	return info, true
}

// holdsCertificate reports whether the copy holds a certificate for name
// (or for the wildcard that covers it) under any issuer.
func (c *localCopy) holdsCertificate(ctx context.Context, name string) bool {
	if c == nil {
		return false
	}
	names := []string{name}
	if i := strings.IndexByte(name, '.'); i > 0 {
		names = append(names, "*"+name[i:])
	}
	for _, n := range names {
		site := certmagic.StorageKeys.Safe(n)
		if !fileSafe(site) {
			continue
		}
		if m, _ := filepath.Glob(c.fs.Filename(path.Join("certificates", "*", site, site+".crt"))); len(m) > 0 {
			return true
		}
	}
	return false
}

func (c *localCopy) exists(ctx context.Context, key string) bool {
	canon := c.canonical(key)
	return canon != "" && c.fs.Exists(ctx, canon)
}

// list answers List for a prefix the copy covers, with the same meaning as
// Storage.List; ok is false for a prefix it does not cover or holds nothing
// under.
func (c *localCopy) list(ctx context.Context, prefix string, recursive bool) ([]string, bool) {
	if c == nil {
		return nil, false
	}
	canon, err := CanonicalKey(prefix)
	if err != nil || !copied(canon+"/") || !fileSafe(canon) {
		return nil, false
	}
	keys, err := c.fs.List(ctx, canon, recursive)
	if err != nil || len(keys) == 0 {
		return nil, false
	}
	return keys, true
}

// follow brings the copy in line with st: each file it holds takes the
// store's value, or goes if the store has none. It returns the keys that
// changed.
func (c *localCopy) follow(ctx context.Context, st *store.Store) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	var changed []string
	for _, top := range []string{"certificates", "ocsp"} {
		files, err := c.fs.List(ctx, top, true)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return changed, fmt.Errorf("listing the local copy: %w", err)
		}
		for _, key := range files {
			ch, err := c.followFile(ctx, st, key)
			if err != nil {
				return changed, err
			}
			if ch {
				changed = append(changed, key)
			}
		}
	}
	return changed, nil
}
