// Package adapttest runs the golden Caddyfile adapt tests of edgeplane's
// Caddy modules: each <name>.caddyfile must adapt, without warnings, to the
// JSON in <name>.json beside it. UPDATE_GOLDEN=1 rewrites the JSON files.
package adapttest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	// The Caddyfile adapter and the http app's global options.
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// Adapt adapts the Caddyfile src (named name in errors) and returns the JSON
// indented with tabs and ending in a newline, as the golden files hold it.
// Warnings fail the test.
func Adapt(t testing.TB, name string, src []byte) []byte {
	t.Helper()
	out, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": name})
	if err != nil {
		t.Fatalf("adapting %s: %v", name, err)
	}
	for _, w := range warns {
		t.Errorf("adapt warning: %s:%d: %s", w.File, w.Line, w.Message)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	buf.WriteByte('\n')
	return buf.Bytes()
}

// Golden runs a subtest per file matching pattern (say
// "testdata/*.caddyfile") comparing its adapted JSON with the golden file.
func Golden(t *testing.T, pattern string) {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden inputs match %s: %v", pattern, err)
	}
	for _, in := range files {
		t.Run(filepath.Base(in), func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got := Adapt(t, in, src)
			golden := strings.TrimSuffix(in, ".caddyfile") + ".json"
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("reading golden file (UPDATE_GOLDEN=1 writes it): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s adapted to:\n%s\nwant (%s):\n%s", in, got, golden, want)
			}
		})
	}
}
