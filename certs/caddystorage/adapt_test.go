package caddystorage_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/edgeplane/edgeplane/certs/caddystorage"
	"github.com/edgeplane/edgeplane/internal/adapttest"
)

func adapt(t *testing.T, caddyfile string) ([]byte, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return out, err
}

func TestCaddyfileAdaptGolden(t *testing.T) {
	adapttest.Golden(t, "testdata/*.caddyfile")
	in, err := os.ReadFile("testdata/storage.caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out := adapttest.Adapt(t, "testdata/storage.caddyfile", in)
	var cfg struct {
		Storage caddystorage.Storage `json:"storage"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Storage.NATSURL != "nats://10.100.0.1:4222" || cfg.Storage.Authority != "prod" || cfg.Storage.CredsFile != "/etc/edgeplane/gateway.creds" {
		t.Fatalf("decoded storage %+v", cfg.Storage)
	}
}

func TestCaddyfileBadInput(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"{\n storage edgeplane {\n  bogus x\n }\n}\n", `unrecognized edgeplane storage option "bogus"`},
		{"{\n storage edgeplane {\n  nats_url\n }\n}\n", "wrong argument count"},
		{"{\n storage edgeplane {\n  nats_url a b\n }\n}\n", "wrong argument count"},
		{"{\n storage edgeplane {\n  nats a b\n }\n}\n", "wrong argument count"},
		{"{\n storage edgeplane {\n  lock_ttl soon\n }\n}\n", "parsing lock_ttl"},
		{"{\n storage edgeplane {\n  lock_ttl 100ms\n }\n}\n", "below the minimum"},
		{"{\n storage edgeplane extra\n}\n", "wrong argument count"},
	} {
		_, err := adapt(t, tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("adapting %q: %v; want an error with %q and the file position", tc.in, err, tc.want)
		}
	}
}
