package main

import (
	"os"
	"path/filepath"
	"strings"
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

// A gateway credential is always bound to the name it reports under:
// `creds issue --role gateway` without --machine is refused with a
// structured error and writes no file; with one it is issued.
func TestCredsIssueGatewayNeedsAName(t *testing.T) {
	dir := t.TempDir()
	authDir := filepath.Join(dir, "auth")
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gateway.creds")
	code, _, errOut := runCLI(t, "creds", "issue", "--auth-dir", authDir, "--role", "gateway", "-o", file)
	if code != 1 || !strings.Contains(errOut, "error: invalid:") || !strings.Contains(errOut, "--machine NAME") {
		t.Fatalf("unbound gateway credentials: exit %d, stderr %q; want exit 1 and an invalid error naming --machine", code, errOut)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("a refused issue left %s: %v", file, err)
	}
	code, out, errOut := runCLI(t, "creds", "issue", "--auth-dir", authDir, "--role", "gateway", "--machine", "edge-1", "-o", file)
	if code != 0 || !strings.Contains(out, "gateway for machine edge-1") {
		t.Fatalf("gateway credentials for edge-1: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
