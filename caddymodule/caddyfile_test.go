package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/encode/gzip"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"

	"github.com/edgeplane/edgeplane/internal/adapttest"
)

// TestCaddyfileAdapt compares testdata/adapt/<name>.caddyfile adapted to
// JSON with <name>.json. UPDATE_GOLDEN=1 rewrites the golden files.
func TestCaddyfileAdapt(t *testing.T) {
	adapttest.Golden(t, "testdata/adapt/*.caddyfile")
}

func TestCaddyfileErrors(t *testing.T) {
	cases := map[string]struct{ src, want string }{
		"unknown option":         {"{\n\tedgeplane {\n\t\tnats nats://x\n\t}\n}\n:80\n", `unrecognized edgeplane option "nats", at Caddyfile:3`},
		"missing value":          {"{\n\tedgeplane {\n\t\tnats_url\n\t}\n}\n:80\n", "Caddyfile:3"},
		"extra value":            {"{\n\tedgeplane {\n\t\tgateway_name a b\n\t}\n}\n:80\n", "Caddyfile:3"},
		"repeated":               {"{\n\tedgeplane {\n\t\tgateway_name a\n\t\tgateway_name b\n\t}\n}\n:80\n", `option "gateway_name" given more than once`},
		"own upstream":           {":80 {\n\tedgeplane 127.0.0.1:9000\n}\n", "edgeplane takes no upstreams"},
		"own to":                 {":80 {\n\tedgeplane {\n\t\tto 127.0.0.1:9000\n\t}\n}\n", "edgeplane takes no upstreams"},
		"dynamic args":           {":80 {\n\treverse_proxy {\n\t\tdynamic edgeplane onlyns\n\t}\n}\n", "dynamic edgeplane takes no arguments or <namespace> <service>, got 1"},
		"bad interval":           {"{\n\tedgeplane {\n\t\thealth_interval soon\n\t}\n}\n:80\n", "edgeplane option health_interval"},
		"disable arg":            {"{\n\tedgeplane {\n\t\tdisable_health_checks yes\n\t}\n}\n:80\n", "Caddyfile:3"},
		"region label":           {"{\n\tedgeplane {\n\t\tregion Tokyo_1\n\t}\n}\n:80\n", `region: "Tokyo_1" is not a DNS label, at Caddyfile:3`},
		"region twice":           {"{\n\tedgeplane {\n\t\tregion tyo\n\t\tregion fra\n\t}\n}\n:80\n", `option "region" given more than once`},
		"access_log_rate":        {"{\n\tedgeplane {\n\t\taccess_log_rate -1\n\t}\n}\n:80\n", "access_log_rate: want a number of lines a second (0 or more), got \"-1\", at Caddyfile:3"},
		"disable_access_log arg": {"{\n\tedgeplane {\n\t\tdisable_access_log yes\n\t}\n}\n:80\n", "Caddyfile:3"},
		"disable_layer4 arg":     {"{\n\tedgeplane {\n\t\tdisable_layer4 yes\n\t}\n}\n:80\n", "Caddyfile:3"},
		"layer4 handler args": {"{\n\tservers {\n\t\tlistener_wrappers {\n\t\t\tlayer4 {\n\t\t\t\troute {\n\t\t\t\t\tedgeplane onlyns\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n:80\n",
			"edgeplane takes no arguments or <namespace> <service>, got 1"},
		"permission arg": {"{\n\ton_demand_tls {\n\t\tpermission edgeplane extra\n\t}\n}\n:80\n", "Caddyfile:3"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.src), map[string]any{"filename": "Caddyfile"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}
