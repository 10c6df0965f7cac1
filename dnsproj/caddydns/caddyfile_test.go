package caddydns

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/edgeplane/edgeplane/internal/adapttest"
)

// TestCaddyfileAdapt compares each testdata/<name>.caddyfile, adapted, with
// <name>.json.
func TestCaddyfileAdapt(t *testing.T) {
	adapttest.Golden(t, "testdata/*.caddyfile")
}

// TestCaddyfileErrors shows every bad input rejected with its line.
func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"unknown option", "edgeplane_dns {\n bogus 1\n}", `unrecognized edgeplane_dns option "bogus"`},
		{"argument on the option", "edgeplane_dns 1.2.3.4", "wrong argument count"},
		{"listen without address", "edgeplane_dns {\n listen\n}", "wrong argument count"},
		{"zone twice on a line", "edgeplane_dns {\n zone a b\n}", "wrong argument count"},
		{"region without a name", "edgeplane_dns {\n region\n}", "wrong argument count"},
		{"two regions", "edgeplane_dns {\n region tyo fra\n}", "wrong argument count"},
		{"region not a DNS label", "edgeplane_dns {\n region eu.west\n}", `region "eu.west": not a DNS label`},
		{"bad ttl", "edgeplane_dns {\n ttl soon\n}", `ttl "soon"`},
		{"negative ttl", "edgeplane_dns {\n ttl -5s\n}", "must be positive"},
		{"forward without upstream", "edgeplane_dns {\n forward\n}", "at least one upstream"},
		{"bad policy", "edgeplane_dns {\n forward 1.1.1.1 {\n  policy fastest\n }\n}", `forward policy "fastest"`},
		{"unknown forward option", "edgeplane_dns {\n forward 1.1.1.1 {\n  tls\n }\n}", `unrecognized forward option "tls"`},
		{"bad max_fails", "edgeplane_dns {\n forward 1.1.1.1 {\n  max_fails zero\n }\n}", "positive integer"},
		{"cache on", "edgeplane_dns {\n cache on\n}", "only argument is off"},
		{"unknown cache option", "edgeplane_dns {\n cache {\n  prefetch 1\n }\n}", `unrecognized cache option "prefetch"`},
		{"bad udp size", "edgeplane_dns {\n max_udp_size big\n}", "positive integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := "{\n" + tc.body + "\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), map[string]any{"filename": "Caddyfile"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:") {
				t.Errorf("error %v does not name the file and line", err)
			}
		})
	}
}
