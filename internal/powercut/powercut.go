// Package powercut is a filesystem for tests that forgets, on a power cut,
// what was not synced, as a machine that loses power does.
//
// It is a FUSE loopback over a backing directory, in the spirit of Jepsen's
// LazyFS: every operation reaches the backing directory at once (so reads
// are plain), and each one that is not durable yet is kept with what undoes
// it. Cut undoes them all, newest first, and detaches the mount: what is
// left in the backing directory is what a disk would hold after the cut,
// and mounting it again is the reboot.
//
// What is durable follows a journaling filesystem in ordered mode (ext4's
// default, data=ordered):
//
//   - a file's data (writes, truncation, allocation) once that file is
//     fsynced (fsync or fdatasync) after it;
//   - the namespace (creation, mkdir, unlink, rmdir, rename) once anything
//     is fsynced after it: a file, a directory or the filesystem, since the
//     journal commits as a whole.
//
// Torn writes, reordered data writes within a file and lost fsyncs are not
// modelled: a cut keeps every synced byte and drops every unsynced one.
// Hard links, symlinks, device nodes, copy_file_range, fallocate modes
// other than plain allocation and RENAME_EXCHANGE are refused (ENOTSUP).
package powercut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// FS is a mounted power-cut filesystem.
type FS struct {
	backing, trash, mountpoint string
	server                     *fuse.Server
	done                       chan struct{}

	// dead is set by Cut: every operation after it fails with EIO, as a
	// disk without power answers nothing.
	dead atomic.Bool

	// mu serializes the operations that change the backing directory with
	// the log of what undoes them, and Cut with both.
	mu sync.Mutex
	// pending is what is not durable yet, oldest first.
	pending []*undo
	// trashed counts the files moved to trash, to name the next one.
	trashed int
}

// Available says why powercut filesystems cannot be mounted here, or nil:
// mounting needs /dev/fuse and root (or fusermount).
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("powercut needs /dev/fuse: %w", err)
	}
	f.Close()
	if os.Geteuid() != 0 {
		return errors.New("powercut mounts as root (mount(2)); run the test as root")
	}
	return nil
}

// Mount serves backing at mountpoint, both existing directories. Files
// moved out of the way by an unlink or a replacing rename wait, until that
// is durable, in a directory beside backing (backing + ".trash"), on the
// same filesystem so that moving them back is a rename.
func Mount(backing, mountpoint string) (*FS, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	f := &FS{backing: backing, trash: backing + ".trash", mountpoint: mountpoint, done: make(chan struct{})}
	if err := os.RemoveAll(f.trash); err != nil {
		return nil, fmt.Errorf("powercut: clearing %s: %w", f.trash, err)
	}
	if err := os.Mkdir(f.trash, 0o700); err != nil {
		return nil, fmt.Errorf("powercut: %w", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, fmt.Errorf("powercut: %s: %w", backing, err)
	}
	root := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	rootNode := &node{LoopbackNode: &fs.LoopbackNode{RootData: root}, fs: f}
	root.RootNode = rootNode
	// No kernel caching of names or attributes: what a process sees after
	// an operation is what the backing directory holds.
	zero := time.Duration(0)
	f.server, err = fs.Mount(mountpoint, rootNode, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "powercut", Name: "powercut", DirectMount: true},
	})
	if err != nil {
		return nil, fmt.Errorf("powercut: mounting %s: %w", mountpoint, err)
	}
	go func() {
		f.server.Wait()
		close(f.done)
	}()
	return f, nil
}

// Cut loses power: everything not durable is undone in the backing
// directory, newest first, every later operation fails with EIO, and the
// mount is detached (processes holding files open keep failing until they
// close them). Mount the backing directory again to reboot.
func (f *FS) Cut() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead.Swap(true) {
		return nil
	}
	var errs []error
	for i := len(f.pending) - 1; i >= 0; i-- {
		if err := f.pending[i].revert(f, f.pending[:i]); err != nil {
			errs = append(errs, err)
		}
	}
	f.pending = nil
	if err := os.RemoveAll(f.trash); err != nil {
		errs = append(errs, err)
	}
	if err := syscall.Unmount(f.mountpoint, syscall.MNT_DETACH); err != nil {
		errs = append(errs, fmt.Errorf("detaching %s: %w", f.mountpoint, err))
	}
	return errors.Join(errs...)
}

// Unmount shuts down cleanly: what is pending stays (a clean shutdown
// syncs), and the mount goes once nothing holds it.
func (f *FS) Unmount() error {
	f.mu.Lock()
	f.pending = nil
	f.mu.Unlock()
	if f.dead.Load() {
		<-f.done
		return nil
	}
	if err := f.server.Unmount(); err != nil {
		return fmt.Errorf("powercut: unmounting %s: %w", f.mountpoint, err)
	}
	<-f.done
	return os.RemoveAll(f.trash)
}

// Done is closed when the mount is gone: after Unmount, or after Cut
// once the last process holding it let go.
func (f *FS) Done() <-chan struct{} { return f.done }

// Pending is how many operations a cut would undo now.
func (f *FS) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// commit makes durable what an fsync of n (nil: of a directory or the
// filesystem) makes durable: the whole namespace, and n's data.
func (f *FS) commit(n *node) {
	kept := f.pending[:0]
	for _, u := range f.pending {
		switch {
		case u.kind == undoData && u.node == n && n != nil:
		case u.kind == undoData:
			kept = append(kept, u)
		case u.trashed != "":
			// An unlink or a replacement made durable: the file is gone
			// for good.
			os.RemoveAll(u.trashed)
		}
	}
	// Data of a file whose unlink is durable now has nothing to come back
	// to.
	out := kept[:0]
	for _, u := range kept {
		if !strings.HasPrefix(u.path, f.trash+string(filepath.Separator)) {
			out = append(out, u)
		}
	}
	clear(f.pending[len(out):])
	f.pending = out
}

// toTrash moves path out of the way, keeping it for a cut to put back.
func (f *FS) toTrash(path string) (string, error) {
	f.trashed++
	dst := filepath.Join(f.trash, fmt.Sprint(f.trashed))
	if err := os.Rename(path, dst); err != nil {
		return "", err
	}
	f.moved(path, dst)
	return dst, nil
}

// moved points the pending data operations of files under from to to:
// each holds where its file is now.
func (f *FS) moved(from, to string) {
	for _, u := range f.pending {
		if u.kind != undoData {
			continue
		}
		if rest, ok := under(u.path, from); ok {
			u.path = to + rest
		}
	}
}

// movedBack is moved for the operations before a cut's position.
func movedBack(earlier []*undo, from, to string) {
	for _, u := range earlier {
		if u.kind != undoData {
			continue
		}
		if rest, ok := under(u.path, from); ok {
			u.path = to + rest
		}
	}
}

// under says whether path is dir or inside it, and what follows dir.
func under(path, dir string) (string, bool) {
	if path == dir {
		return "", true
	}
	if strings.HasPrefix(path, dir+string(filepath.Separator)) {
		return path[len(dir):], true
	}
	return "", false
}
