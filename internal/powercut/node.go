package powercut

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is a loopback node whose changes are logged with what undoes them.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeReader         = (*node)(nil)
	_ fs.NodeWriter         = (*node)(nil)
	_ fs.NodeWritever       = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeAllocater      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.FileReaddirenter   = (*dirHandle)(nil)
	_ fs.FileFsyncdirer     = (*dirHandle)(nil)
	_ fs.FileSeekdirer      = (*dirHandle)(nil)
	_ fs.FileReleasedirer   = (*dirHandle)(nil)
)

// WrapChild makes every node of the tree a powercut node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fs: n.fs}
}

// backingPath is where n is in the backing directory.
func (n *node) backingPath() string {
	return filepath.Join(n.fs.backing, n.Path(n.Root()))
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.dead.Load() {
		return nil, syscall.EIO
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return nil, nil, 0, syscall.EIO
	}
	path := filepath.Join(n.backingPath(), name)
	var u *undo
	if _, err := os.Lstat(path); err == nil {
		if flags&syscall.O_TRUNC != 0 {
			// Opening an existing file with O_TRUNC: a data operation.
			if u, err = before(path, 0, math.MaxInt64); err != nil {
				return nil, nil, 0, fs.ToErrno(err)
			}
		}
	} else {
		u = &undo{kind: undoCreate, path: path}
	}
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	fh = noPassthrough(fh)
	if errno == 0 && u != nil {
		if child, ok := ch.Operations().(*node); ok && u.kind == undoData {
			u.node = child
		}
		n.fs.pending = append(n.fs.pending, u)
	}
	return ch, fh, fl, errno
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return nil, syscall.EIO
	}
	ch, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 {
		n.fs.pending = append(n.fs.pending, &undo{kind: undoCreate, dir: true, path: filepath.Join(n.backingPath(), name)})
	}
	return ch, errno
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	path := filepath.Join(n.backingPath(), name)
	st, err := os.Lstat(path)
	if err != nil {
		return fs.ToErrno(err)
	}
	if st.IsDir() {
		return syscall.EISDIR
	}
	// Kept aside rather than removed, for a cut to put back.
	trashed, err := n.fs.toTrash(path)
	if err != nil {
		return fs.ToErrno(err)
	}
	n.fs.pending = append(n.fs.pending, &undo{kind: undoRemove, path: path, trashed: trashed})
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	path := filepath.Join(n.backingPath(), name)
	st, err := os.Lstat(path)
	if err != nil {
		return fs.ToErrno(err)
	}
	errno := n.LoopbackNode.Rmdir(ctx, name)
	if errno == 0 {
		n.fs.pending = append(n.fs.pending, &undo{kind: undoRemove, dir: true, mode: st.Mode(), path: path})
	}
	return errno
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	const renameNoReplace = 1
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&^renameNoReplace != 0 {
		return syscall.ENOTSUP
	}
	from := filepath.Join(n.backingPath(), name)
	to := filepath.Join(np.backingPath(), newName)
	if _, err := os.Lstat(from); err != nil {
		return fs.ToErrno(err)
	}
	u := &undo{kind: undoRename, from: from, path: to}
	if st, err := os.Lstat(to); err == nil {
		if flags&renameNoReplace != 0 {
			return syscall.EEXIST
		}
		if st.IsDir() {
			// Replacing a directory (empty, or rename fails): kept as a
			// removal to undo.
			if err := syscall.Rmdir(to); err != nil {
				return fs.ToErrno(err)
			}
			n.fs.pending = append(n.fs.pending, &undo{kind: undoRemove, dir: true, mode: st.Mode(), path: to})
		} else {
			trashed, err := n.fs.toTrash(to)
			if err != nil {
				return fs.ToErrno(err)
			}
			u.trashed = trashed
		}
	}
	if errno := n.LoopbackNode.Rename(ctx, name, np.LoopbackNode, newName, flags); errno != 0 {
		if u.trashed != "" {
			os.Rename(u.trashed, to)
			n.fs.moved(u.trashed, to)
		}
		return errno
	}
	n.fs.moved(from, to)
	n.fs.pending = append(n.fs.pending, u)
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	sz, truncating := in.GetSize()
	var u *undo
	if truncating {
		var err error
		if u, err = before(n.backingPath(), int64(sz), math.MaxInt64-int64(sz)); err != nil {
			return fs.ToErrno(err)
		}
		u.node = n
	}
	errno := n.LoopbackNode.Setattr(ctx, f, in, out)
	if errno == 0 && u != nil {
		n.fs.pending = append(n.fs.pending, u)
	}
	return errno
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return nil, 0, syscall.EIO
	}
	var u *undo
	if flags&syscall.O_TRUNC != 0 {
		var err error
		if u, err = before(n.backingPath(), 0, math.MaxInt64); err != nil {
			return nil, 0, fs.ToErrno(err)
		}
		u.node = n
	}
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	fh = noPassthrough(fh)
	if errno == 0 && u != nil {
		n.fs.pending = append(n.fs.pending, u)
	}
	return fh, fl, errno
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if n.fs.dead.Load() {
		return nil, syscall.EIO
	}
	return f.(fs.FileReader).Read(ctx, dest, off)
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return 0, syscall.EIO
	}
	u, err := before(n.backingPath(), off, int64(len(data)))
	if err != nil {
		return 0, fs.ToErrno(err)
	}
	u.node = n
	written, errno := f.(fs.FileWriter).Write(ctx, data, off)
	if written > 0 {
		n.fs.pending = append(n.fs.pending, u)
	}
	return written, errno
}

func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	return n.Write(ctx, f, bytes.Join(data, nil), off)
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	if mode != 0 {
		// Punching holes and zeroing ranges change data in ways not
		// modelled.
		return syscall.ENOTSUP
	}
	u, err := before(n.backingPath(), 0, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	u.node = n
	errno := f.(fs.FileAllocater).Allocate(ctx, off, size, mode)
	if errno == 0 {
		n.fs.pending = append(n.fs.pending, u)
	}
	return errno
}

// Fsync makes n's data and the whole namespace durable (see the package
// doc), once the backing file is synced itself.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.dead.Load() {
		return syscall.EIO
	}
	if fsy, ok := f.(fs.FileFsyncer); ok {
		if errno := fsy.Fsync(ctx, flags); errno != 0 {
			return errno
		}
	}
	n.fs.commit(n)
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.fs.dead.Load() {
		return nil, 0, syscall.EIO
	}
	ds, fl, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{FileHandle: ds, fs: n.fs}, fl, 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.ENOTSUP
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.ENOTSUP
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.ENOTSUP
}

// CopyFileRange is refused so that the kernel copies with reads and
// writes, which are logged.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut, length, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOTSUP
}

// dirHandle is the loopback's directory stream, its fsync a commit of the
// namespace.
type dirHandle struct {
	fs.FileHandle
	fs *FS
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if d.fs.dead.Load() {
		return nil, syscall.EIO
	}
	return d.FileHandle.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.FileHandle.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.FileHandle.(fs.FileReleasedirer).Releasedir(ctx, flags)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.fs.mu.Lock()
	defer d.fs.mu.Unlock()
	if d.fs.dead.Load() {
		return syscall.EIO
	}
	if errno := d.FileHandle.(fs.FileFsyncdirer).Fsyncdir(ctx, flags); errno != 0 {
		return errno
	}
	d.fs.commit(nil)
	return 0
}

// file is the loopback's file, kept from the kernel's passthrough: with
// FUSE passthrough (Linux 6.9 and later, as root) the kernel reads and
// writes the backing file itself, and the writes would never be logged.
type file struct {
	*fs.LoopbackFile
}

// PassthroughFd refuses passthrough.
func (f *file) PassthroughFd() (int, bool) { return -1, false }

func noPassthrough(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &file{LoopbackFile: lf}
	}
	return fh
}
