// Package atomicfile replaces files whole: a reader sees the old content or
// the new, never a part, even across a crash, and two writers never share
// a temporary file. Every part's state files (identities, trials, keys,
// certificates) are written this way.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data, mode mode: a temporary file beside it,
// synced, renamed over it, and the directory synced so the rename itself
// survives a crash.
func Write(path string, data []byte, mode os.FileMode) error {
	return WriteOwned(path, data, mode, -1, -1)
}

// WriteOwned is Write with the file owned by uid and gid (-1 keeps the
// writer's), set before the rename: the file is never there with another
// owner.
func WriteOwned(path string, data []byte, mode os.FileMode, uid, gid int) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), mode)
	}
	if err == nil && (uid >= 0 || gid >= 0) {
		err = os.Lchown(f.Name(), uid, gid)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the entries of dir (a rename into it) durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
