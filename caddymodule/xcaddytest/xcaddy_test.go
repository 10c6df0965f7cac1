package xcaddytest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	// Everything the module root registers: the modules the built binary
	// must list.
	_ "github.com/edgeplane/edgeplane"
)

const (
	xcaddyVersion = "v0.4.7"  // the proxy serves xcaddy by exact version only
	caddyVersion  = "v2.11.9" // the version our go.mod requires
)

func TestXcaddyBuildListsEveryModule(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH: cannot run xcaddy")
	}
	repo := repoRoot(t, goBin)
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()

	// xcaddy comes from a throwaway tools module: our go.mod stays as is.
	// GOPRIVATE: the proxy answers 400 for our module. GOVCS off for it:
	// without a reachable github.com, `go get` of the replaced module must
	// not try git but fall back to the local replacement.
	tools := t.TempDir()
	env := append(os.Environ(), "GOPRIVATE=github.com/edgeplane/*", "GOVCS=github.com/edgeplane:off",
		"GOFLAGS=-buildvcs=false", "GOWORK=off")
	run(ctx, t, tools, env, goBin, "mod", "init", "edgeplane.test/xcaddytools")
	run(ctx, t, tools, env, goBin, "get", "-tool", "github.com/caddyserver/xcaddy/cmd/xcaddy@"+xcaddyVersion)

	out := filepath.Join(t.TempDir(), "caddy")
	start := time.Now()
	run(ctx, t, tools, env, goBin, "tool", "xcaddy", "build", caddyVersion,
		"--with", "github.com/edgeplane/edgeplane="+repo, "--output", out)
	t.Logf("xcaddy build took %s", time.Since(start).Round(time.Second))

	listed := map[string]bool{}
	for _, line := range strings.Split(run(ctx, t, tools, env, out, "list-modules"), "\n") {
		listed[strings.TrimSpace(line)] = true
	}
	var missing []string
	for _, m := range caddy.Modules() {
		if !listed[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the xcaddy build lacks modules: %s", strings.Join(missing, ", "))
	}
	for _, ours := range []string{"edgeplane", "http.handlers.edgeplane", "http.reverse_proxy.upstreams.edgeplane",
		"tls.permission.edgeplane", "admin.api.edgeplane"} {
		if !listed[ours] {
			t.Errorf("the xcaddy build lacks %s", ours)
		}
	}
}

func repoRoot(t *testing.T, goBin string) string {
	t.Helper()
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		t.Fatal("not inside the edgeplane module")
	}
	return filepath.Dir(mod)
}

func run(ctx context.Context, t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
