package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

// `control creds issue -o FILE` leaves a file only its owner reads,
// whatever mode the file it replaces had; the key files of a new auth
// dir are private the same way.
func TestCredsFileIsPrivateWhateverWasThere(t *testing.T) {
	data := t.TempDir()
	if _, err := storagenode.LoadAuth(filepath.Join(data, "auth"), true); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "agent.creds")
	if err := os.WriteFile(file, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o666); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "creds", "issue", "--role", "control", "--data", data, "-o", file); code != 0 {
		t.Fatalf("creds issue: %d %s", code, stderr)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials written over a %o file are %o, want 600", 0o666, fi.Mode().Perm())
	}
	entries, err := os.ReadDir(filepath.Join(data, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("auth dir file %s is %o", e.Name(), fi.Mode().Perm())
		}
	}
}
