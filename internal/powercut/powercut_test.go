package powercut_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/edgeplane/edgeplane/internal/powercut"
)

// mounted mounts a fresh powercut filesystem and returns it, its mount
// point and its backing directory.
func mounted(t *testing.T) (*powercut.FS, string, string) {
	t.Helper()
	if err := powercut.Available(); err != nil {
		t.Skipf("skipped: %v", err)
	}
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "disk"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := powercut.Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return f, mnt, backing
}

// write writes data to path (created or truncated), synced when sync says.
func write(t *testing.T, path, data string, sync bool) {
	t.Helper()
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := file.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// appendTo appends data to path without a sync.
func appendTo(t *testing.T, path, data string) {
	t.Helper()
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

// holds fails unless path holds want; "" wants it absent.
func holds(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	switch {
	case want == "" && errors.Is(err, os.ErrNotExist):
	case want == "" && err == nil:
		t.Errorf("%s holds %q after the cut, want it gone", filepath.Base(path), b)
	case err != nil:
		t.Errorf("%s after the cut: %v", filepath.Base(path), err)
	case string(b) != want:
		t.Errorf("%s holds %q after the cut, want %q", filepath.Base(path), b, want)
	}
}

// cutAndReboot cuts f's power and mounts its disk again.
func cutAndReboot(t *testing.T, f *powercut.FS, backing, mnt string) {
	t.Helper()
	if err := f.Cut(); err != nil {
		t.Fatalf("cut: %v", err)
	}
	<-f.Done()
	again, err := powercut.Mount(backing, mnt)
	if err != nil {
		t.Fatalf("reboot: %v", err)
	}
	t.Cleanup(func() {
		if err := again.Unmount(); err != nil {
			t.Error(err)
		}
	})
}

func TestAWriteNotSyncedIsGoneAfterACut(t *testing.T) {
	f, mnt, backing := mounted(t)
	p := filepath.Join(mnt, "log")
	write(t, p, "synced", true)
	appendTo(t, p, " and not")
	holds(t, p, "synced and not") // before the cut, a reader sees it all
	if n := f.Pending(); n != 1 {
		t.Errorf("%d operations pending, want the one append", n)
	}
	cutAndReboot(t, f, backing, mnt)
	holds(t, p, "synced")
}

func TestASyncedWriteStays(t *testing.T) {
	f, mnt, backing := mounted(t)
	write(t, filepath.Join(mnt, "a"), "one", true)
	write(t, filepath.Join(mnt, "b"), "two", false)
	// An overwrite of a synced file, synced: the new bytes stay.
	write(t, filepath.Join(mnt, "a"), "three!", true)
	cutAndReboot(t, f, backing, mnt)
	holds(t, filepath.Join(mnt, "a"), "three!")
	// b's creation is durable (a's fsync commits the namespace), its
	// data is not.
	if st, err := os.Stat(filepath.Join(mnt, "b")); err != nil || st.Size() != 0 {
		t.Errorf("b after the cut: %v, %v; want it there and empty", st, err)
	}
}

func TestARenameNotSyncedIsUndone(t *testing.T) {
	f, mnt, backing := mounted(t)
	write(t, filepath.Join(mnt, "index"), "old index", true)
	write(t, filepath.Join(mnt, "index.tmp"), "new index", true)
	// Replaces index; not synced.
	if err := os.Rename(filepath.Join(mnt, "index.tmp"), filepath.Join(mnt, "index")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "index"), filepath.Join(mnt, "moved")); err != nil {
		t.Fatal(err)
	}
	cutAndReboot(t, f, backing, mnt)
	holds(t, filepath.Join(mnt, "index"), "old index")
	holds(t, filepath.Join(mnt, "index.tmp"), "new index")
	holds(t, filepath.Join(mnt, "moved"), "")
}

func TestASyncedRenameStays(t *testing.T) {
	f, mnt, backing := mounted(t)
	write(t, filepath.Join(mnt, "index"), "old index", true)
	write(t, filepath.Join(mnt, "index.tmp"), "new index", true)
	if err := os.Rename(filepath.Join(mnt, "index.tmp"), filepath.Join(mnt, "index")); err != nil {
		t.Fatal(err)
	}
	// Syncing the directory commits the rename.
	d, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	cutAndReboot(t, f, backing, mnt)
	holds(t, filepath.Join(mnt, "index"), "new index")
	holds(t, filepath.Join(mnt, "index.tmp"), "")
}

// Creations, directories, unlinks and truncations not synced are undone
// too, and a file written after its directory was renamed is put back
// where it was.
func TestTheNamespaceNotSyncedIsUndone(t *testing.T) {
	f, mnt, backing := mounted(t)
	keep := filepath.Join(mnt, "keep")
	write(t, keep, "kept bytes", true)
	if err := os.Mkdir(filepath.Join(mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mnt, "dir", "f"), "in dir", true) // durable, and so is dir
	if err := os.Truncate(keep, 4); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "dir"), filepath.Join(mnt, "dir2")); err != nil {
		t.Fatal(err)
	}
	appendTo(t, filepath.Join(mnt, "dir2", "f"), ", appended")
	if err := os.Remove(filepath.Join(mnt, "dir2", "f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mnt, "new", "g"), "never synced", false)
	cutAndReboot(t, f, backing, mnt)
	holds(t, keep, "kept bytes")
	holds(t, filepath.Join(mnt, "dir", "f"), "in dir")
	if _, err := os.Stat(filepath.Join(mnt, "dir2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dir2 after the cut: %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("new after the cut: %v, want it gone", err)
	}
	entries, err := os.ReadDir(mnt)
	if err != nil || len(entries) != 2 {
		t.Errorf("the disk after the cut: %v %v, want dir and keep", entries, err)
	}
}

// After the cut, the disk answers nothing: a process still holding a
// file gets I/O errors, not a disk that goes on.
func TestAfterTheCutNothingAnswers(t *testing.T) {
	f, mnt, _ := mounted(t)
	file, err := os.OpenFile(filepath.Join(mnt, "held"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Cut(); err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteString("late"); !errors.Is(err, syscall.EIO) {
		t.Errorf("a write after the cut: %v, want EIO", err)
	}
	file.Close()
	<-f.Done()
}
