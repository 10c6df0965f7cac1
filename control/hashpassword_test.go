package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

// withPassword makes content the process's stdin, which hash-password
// reads (a file, not a terminal).
func withPassword(t *testing.T, content string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	old := os.Stdin
	os.Stdin = f
	t.Cleanup(func() { os.Stdin = old })
}

// hash-password prints a hash of the first line of stdin that the
// manifest accepts and that verifies the password: bcrypt at Caddy's
// cost by default, argon2id on request; a bad algorithm or an empty
// password is a usage error.
func TestHashPassword(t *testing.T) {
	withPassword(t, "wonderland\r\nignored\n")
	code, out, errOut := runCLI(t, "hash-password")
	if code != 0 {
		t.Fatalf("hash-password: exit %d: %s", code, errOut)
	}
	h := strings.TrimSpace(out)
	if cost, err := bcrypt.Cost([]byte(h)); err != nil || cost != manifest.BcryptCost {
		t.Fatalf("bcrypt hash %q: cost %d, %v", h, cost, err)
	}
	if bcrypt.CompareHashAndPassword([]byte(h), []byte("wonderland")) != nil {
		t.Fatalf("the hash does not verify the password")
	}

	withPassword(t, "correct horse")
	code, out, errOut = runCLI(t, "hash-password", "--algorithm", "argon2id")
	if code != 0 {
		t.Fatalf("hash-password --algorithm argon2id: exit %d: %s", code, errOut)
	}
	a := strings.TrimSpace(out)
	if store.PasswordHashKind(a) != "argon2id" || !strings.HasPrefix(a, "$argon2id$v=19$m=47104,t=1,p=1$") {
		t.Fatalf("argon2id hash %q", a)
	}
	for _, hash := range []string{h, a} {
		m := &store.Manifest{Namespace: "a", Services: map[string]store.ServiceSpec{"web": {Command: []string{"x"},
			Routes: []store.Route{{Hosts: []string{"a.example"}, BasicAuth: &store.BasicAuth{Users: []store.BasicAuthUser{{Username: "u", Hash: hash}}}}}}}}
		if err := manifest.Validate(m); err != nil {
			t.Fatalf("the manifest refuses the printed hash %q: %v", hash, err)
		}
	}

	withPassword(t, "x")
	if code, _, errOut := runCLI(t, "hash-password", "--algorithm", "md5"); code != 1 || !strings.Contains(errOut, `the algorithm must be bcrypt or argon2id, not "md5"`) {
		t.Fatalf("a bad algorithm: exit %d: %s", code, errOut)
	}
	withPassword(t, "\n")
	if code, _, errOut := runCLI(t, "hash-password"); code != 1 || !strings.Contains(errOut, "an empty password") {
		t.Fatalf("an empty password: exit %d: %s", code, errOut)
	}
}
