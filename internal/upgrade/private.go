package upgrade

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Release dirs are written by the root agent and read by the services it
// stages binaries for. Were one inside a directory another user can
// write (the gateway's state dir, owned by the gateway's user), that user
// could plant a link where the agent writes (a version dir pointing at
// /usr/sbin, current pointing anywhere) and have root write or run what
// it chose. So the agent writes only where no other user can change what
// a path names: the dir, and every directory above it, owned by the
// agent's user or root and writable by no one else (a sticky directory
// such as /tmp aside: there only an entry's owner renames or removes it),
// and it follows no link inside.

// ErrNotPrivate is wrapped by the errors of a release dir that another
// user could change.
var ErrNotPrivate = errors.New("not private to this user")

// ownedSafely checks fi (of path, from Lstat) is owned by this process's
// user or root and, for a directory, writable by no one else unless
// sticky.
func ownedSafely(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", path)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d: %w", path, uid, ErrNotPrivate)
	}
	if fi.IsDir() && fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("%s is writable by others (mode %v): %w", path, fi.Mode().Perm(), ErrNotPrivate)
	}
	return nil
}

// checkChain checks dir and every directory above it (the links among
// them and the directories they lead to as well).
func checkChain(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if err := ownedSafely(p, fi); err != nil {
			return err
		}
		if p == filepath.Dir(p) {
			break
		}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if real == dir {
		return nil
	}
	return checkChain(real)
}

// ensurePrivateDir makes dir (mode perm) and the directories it needs
// above it, each checked as it goes: an existing one must be a real
// directory (not a link) that no other user can change.
func ensurePrivateDir(dir string, perm os.FileMode) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if parent := filepath.Dir(dir); parent != dir {
			if err := ensurePrivateDir(parent, perm); err != nil {
				return err
			}
		}
		if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%v): not followed: %w", dir, fi.Mode().Type(), ErrNotPrivate)
	}
	return checkChain(dir)
}
