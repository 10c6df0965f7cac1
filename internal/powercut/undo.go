package powercut

import (
	"fmt"
	"os"
	"syscall"
)

type undoKind int

const (
	// undoData puts back a file's bytes and size (a write, a truncation,
	// an allocation).
	undoData undoKind = iota
	// undoCreate removes a created file or directory.
	undoCreate
	// undoRemove puts back an unlinked file (from trash) or a removed
	// directory.
	undoRemove
	// undoRename moves a renamed file back, and what it replaced.
	undoRename
)

// undo is one operation not durable yet, with what reverts it.
type undo struct {
	kind undoKind
	// node is the file a data operation changed: an fsync of it makes
	// the operation durable.
	node *node
	// path is where the operation's file is now (kept current through
	// later renames and unlinks); for a rename, its destination.
	path string

	// undoData: the file's size before, and the bytes it held at off.
	size int64
	off  int64
	old  []byte

	// undoCreate, undoRemove: a directory.
	dir  bool
	mode os.FileMode

	// undoRename: where the file was.
	from string
	// undoRemove, undoRename: where the file unlinked or replaced waits.
	trashed string
}

// revert undoes u on the backing directory; earlier are the operations
// before it, whose paths follow what revert moves.
func (u *undo) revert(f *FS, earlier []*undo) error {
	switch u.kind {
	case undoData:
		return revertData(u)
	case undoCreate:
		var err error
		if u.dir {
			err = syscall.Rmdir(u.path)
		} else {
			err = syscall.Unlink(u.path)
		}
		if err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("powercut: undoing the creation of %s: %w", u.path, err)
		}
	case undoRemove:
		if u.dir {
			if err := os.Mkdir(u.path, u.mode.Perm()); err != nil {
				return fmt.Errorf("powercut: undoing the removal of %s: %w", u.path, err)
			}
			return nil
		}
		if err := os.Rename(u.trashed, u.path); err != nil {
			return fmt.Errorf("powercut: undoing the unlink of %s: %w", u.path, err)
		}
		movedBack(earlier, u.trashed, u.path)
	case undoRename:
		if err := os.Rename(u.path, u.from); err != nil {
			return fmt.Errorf("powercut: undoing the rename of %s to %s: %w", u.from, u.path, err)
		}
		movedBack(earlier, u.path, u.from)
		if u.trashed != "" {
			if err := os.Rename(u.trashed, u.path); err != nil {
				return fmt.Errorf("powercut: putting back %s, replaced by a rename: %w", u.path, err)
			}
			movedBack(earlier, u.trashed, u.path)
		}
	}
	return nil
}

// revertData puts back the bytes a data operation overwrote and the size
// the file had.
func revertData(u *undo) error {
	file, err := os.OpenFile(u.path, os.O_WRONLY, 0)
	if os.IsNotExist(err) {
		// Removed since, by an operation that is durable: nothing to put
		// back.
		return nil
	}
	if err != nil {
		return fmt.Errorf("powercut: undoing a write to %s: %w", u.path, err)
	}
	defer file.Close()
	if len(u.old) > 0 {
		if _, err := file.WriteAt(u.old, u.off); err != nil {
			return fmt.Errorf("powercut: undoing a write to %s: %w", u.path, err)
		}
	}
	if err := file.Truncate(u.size); err != nil {
		return fmt.Errorf("powercut: undoing a write to %s: %w", u.path, err)
	}
	return nil
}

// before reads what path holds at [off, off+n) (as far as its size) and
// its size: what a data operation there would need to be undone.
func before(path string, off, n int64) (*undo, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, err
	}
	u := &undo{kind: undoData, path: path, size: st.Size(), off: off}
	if end := min(off+n, st.Size()); end > off {
		u.old = make([]byte, end-off)
		if _, err := file.ReadAt(u.old, off); err != nil {
			return nil, err
		}
	}
	return u, nil
}
