package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store/storagenode"
)

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
