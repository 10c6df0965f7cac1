package storagenode

import (
	"os"
	"syscall"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// On a disk with less free space than the store's limits add up to, the
// node's limit is the reservation plus what nats-server would have
// allowed: the layout is provisioned, and a stream beyond it (an
// operator's, a test's) still finds room. On a roomy disk nats-server's
// own default stands; a limit set by hand is kept.
func TestStoreLimit(t *testing.T) {
	if got, err := storeLimit(12345, t.TempDir(), nil); err != nil || got != 12345 {
		t.Fatalf("a limit set by hand: %d, %v", got, err)
	}
	t.Run("this disk", func(t *testing.T) { checkStoreLimit(t, t.TempDir()) })
	t.Run("a 1 GiB disk", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("mounting a small tmpfs needs root")
		}
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1g"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		checkStoreLimit(t, dir)
	})
}

func checkStoreLimit(t *testing.T, dir string) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	got, err := storeLimit(0, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	reserved := store.ReservedBytes()
	if free/4*3 >= reserved {
		if got != 0 {
			t.Fatalf("roomy disk (%d free): limit %d, want nats-server's default", free, got)
		}
		return
	}
	// Free space moves while the test runs: allow for a few megabytes.
	if got < reserved+free/4*3-64<<20 || got > reserved+free/4*3+64<<20 {
		t.Fatalf("small disk (%d free): limit %d, want the reservation %d plus three quarters of the free space", free, got, reserved)
	}
}
