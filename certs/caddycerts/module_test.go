package caddycerts_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgeplane/edgeplane/store/storetest"
)

// config is a gateway config with the edgeplane issuer in an on-demand
// policy, storage (nil: Caddy's default file storage) and app settings.
func config(t *testing.T, storage, app map[string]any, issuer map[string]any) *caddy.Config {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	t.Setenv("XDG_DATA_HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", dir)
	iss := map[string]any{"module": "edgeplane", "ca": "https://127.0.0.1:1/dir"}
	for k, v := range issuer {
		iss[k] = v
	}
	apps := map[string]any{
		"http": map[string]any{"http_port": 18080, "https_port": 18443, "servers": map[string]any{
			"s": map[string]any{"listen": []string{"127.0.0.1:18443"}, "tls_connection_policies": []any{map[string]any{}}}}},
		"tls": map[string]any{"automation": map[string]any{"policies": []any{map[string]any{"issuers": []any{iss}}}}},
	}
	if app != nil {
		apps["edgeplane_certs"] = app
	}
	cfg := map[string]any{"admin": map[string]any{"disabled": true}, "apps": apps}
	if storage != nil {
		cfg["storage"] = storage
	}
	raw, _ := json.Marshal(cfg)
	var c caddy.Config
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// The issuer, its app and the HTTP app's auto-HTTPS (which re-provisions
// the ACME issuer it finds through GetACMEIssuer) provision together on the
// edgeplane storage, without any events configuration.
func TestProvisionOnEdgeplaneStorage(t *testing.T) {
	srv := storetest.Start(t)
	storage := map[string]any{"module": "edgeplane", "nats_url": srv.URL}
	if err := caddy.Validate(config(t, storage, nil, nil)); err != nil {
		t.Fatal(err)
	}
	app := map[string]any{"gateway_name": "gw-x", "retry_backoff": "1m", "retry_backoff_max": "1h", "ack_wait": "1m"}
	if err := caddy.Validate(config(t, storage, app, map[string]any{"budget_limit": 5, "budget_window": "24h"})); err != nil {
		t.Fatal(err)
	}
}

func TestProvisionBadConfig(t *testing.T) {
	srv := storetest.Start(t)
	storage := map[string]any{"module": "edgeplane", "nats_url": srv.URL}
	for _, tc := range []struct {
		name             string
		storage, app, is map[string]any
		want             string
	}{
		{"file storage", nil, nil, nil, "needs the edgeplane certificate storage"},
		{"negative budget", storage, nil, map[string]any{"budget_limit": -1}, "budget_limit -1 is negative"},
		{"negative window", storage, nil, map[string]any{"budget_window": "-1h"}, "budget_window -1h0m0s is negative"},
		{"backoff max below first", storage, map[string]any{"retry_backoff": "1h", "retry_backoff_max": "1m"}, nil, "shorter than retry_backoff"},
		{"short ack wait", storage, map[string]any{"ack_wait": "1s"}, nil, "below the minimum 3s"},
		{"negative backoff", storage, map[string]any{"retry_backoff": "-1s"}, nil, "must not be negative"},
	} {
		err := caddy.Validate(config(t, tc.storage, tc.app, tc.is))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}
