package upgrade

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A link planted in a release dir is never followed: a version dir that
// is a link (to a system directory, say) refuses the staging and nothing
// is written where it leads; a release dir that is a link, or that sits
// in a directory another user may write, refuses every write.
func TestStagingFollowsNoPlantedLink(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "gateway"))
	stage(t, d, "1.0.0")
	victim := t.TempDir()
	if err := os.Symlink(victim, filepath.Join(string(d), "1.1.0")); err != nil {
		t.Fatal(err)
	}
	_, err := d.Stage("1.1.0", "caddy", func(w io.Writer) error {
		_, err := io.WriteString(w, "#!/bin/sh\nid\n")
		return err
	})
	if !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("staging through a planted link: %v", err)
	}
	if entries, _ := os.ReadDir(victim); len(entries) != 0 {
		t.Fatalf("wrote through the link: %v", entries)
	}

	// The release dir itself a link: refused, nothing written there.
	elsewhere := t.TempDir()
	linked := Dir(filepath.Join(t.TempDir(), "releases"))
	if err := os.Symlink(elsewhere, string(linked)); err != nil {
		t.Fatal(err)
	}
	if _, err := linked.Stage("1.1.0", "caddy", func(io.Writer) error { return nil }); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("a release dir that is a link: %v", err)
	}
	if err := linked.Point(filepath.Join(string(linked), "1.1.0", "caddy")); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("pointing current in a linked release dir: %v", err)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("wrote through the link: %v", entries)
	}

	// A directory above it that others may write (without the sticky
	// bit): refused.
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Dir(filepath.Join(open, "releases")).Stage("1.1.0", "caddy", func(io.Writer) error { return nil }); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("a release dir under a world-writable dir: %v", err)
	}
	// A version name that climbs out: refused.
	if _, err := d.Stage("../x", "caddy", func(io.Writer) error { return nil }); err == nil {
		t.Fatal("staged ../x")
	}
}

// A release dir owned by another user (the gateway's own state dir, as
// the packages used to have it) is refused: only root can give a
// directory away, so the test needs root.
func TestStagingRefusesAnotherUsersDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory another user owns")
	}
	state := filepath.Join(t.TempDir(), "gateway")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	d := Dir(filepath.Join(state, "releases"))
	_, err := d.Stage("1.1.0", "caddy", func(io.Writer) error { return nil })
	if !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("staging in another user's dir: %v", err)
	}
	t.Logf("refused: %v", err)
	if _, err := os.Lstat(string(d)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the release dir was made: %v", err)
	}
}
