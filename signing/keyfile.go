package signing

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// KeyFile is a signer's key file, read again whenever it changes: a
// rotation (which replaces the file) takes effect in a running process at
// its next signature, with no restart and no signature lost.
type KeyFile struct {
	path string

	mu  sync.Mutex
	key *Key
	fi  os.FileInfo
}

// OpenKeyFile reads a signer's key file.
func OpenKeyFile(path string) (*KeyFile, error) {
	f := &KeyFile{path: path}
	if _, err := f.SigningKey(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the file's path.
func (f *KeyFile) Path() string { return f.path }

// SigningKey returns the file's key, reading the file again if it changed.
func (f *KeyFile) SigningKey() (*Key, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A rotation renames a new file into place: another inode.
	if f.key != nil && os.SameFile(fi, f.fi) && fi.ModTime().Equal(f.fi.ModTime()) {
		return f.key, nil
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("signing key %s is readable by others (mode %v): chmod 600 it", f.path, fi.Mode().Perm())
	}
	k, err := ReadKeyFile(f.path)
	if err != nil {
		return nil, err
	}
	if k.IsRoot() {
		return nil, fmt.Errorf("signing key %s is a trust root, not a signer: intent is signed by signers the root certifies", f.path)
	}
	f.key, f.fi = k, fi
	return k, nil
}

// RootFile is the trust root's seed, in a storage node's auth dir.
const RootFile = "signing-root.nk"

// LoadRoot reads the trust root from dir, an auth dir: nil if it holds
// none.
func LoadRoot(dir string) (*Key, error) {
	k, err := ReadKeyFile(filepath.Join(dir, RootFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !k.IsRoot() {
		return nil, fmt.Errorf("%s in %s is not a trust root (an operator nkey)", RootFile, dir)
	}
	return k, nil
}

// LoadOrCreateRoot reads the trust root from dir, creating it (and dir)
// when missing.
func LoadOrCreateRoot(dir string) (k *Key, created bool, err error) {
	if k, err = LoadRoot(dir); k != nil || err != nil {
		return k, false, err
	}
	if k, err = NewRoot(); err != nil {
		return nil, false, err
	}
	if err := WriteKeyFile(filepath.Join(dir, RootFile), k); err != nil {
		return nil, false, err
	}
	return k, true, nil
}
