package caddycerts_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/edgeplane/edgeplane/certs/caddycerts"
	_ "github.com/edgeplane/edgeplane/certs/caddystorage"
	"github.com/edgeplane/edgeplane/internal/adapttest"
)

func adapt(t *testing.T, caddyfile string) ([]byte, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return out, err
}

// The Caddyfile a gateway operator writes adapts to the JSON in the golden
// file, and that JSON decodes back into the modules with every field set.
func TestCaddyfileAdaptGolden(t *testing.T) {
	adapttest.Golden(t, "testdata/*.caddyfile")
	in, err := os.ReadFile("testdata/gateway.caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out := adapttest.Adapt(t, "testdata/gateway.caddyfile", in)

	var cfg struct {
		Apps struct {
			Certs caddycerts.App `json:"edgeplane_certs"`
			TLS   struct {
				Automation struct {
					Policies []struct {
						Subjects []string            `json:"subjects"`
						Issuers  []caddycerts.Issuer `json:"issuers"`
					} `json:"policies"`
				} `json:"automation"`
			} `json:"tls"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	app := cfg.Apps.Certs
	if app.GatewayName != "gw-eu-1" || time.Duration(app.RetryBackoff) != 30*time.Second || time.Duration(app.RetryBackoffMax) != 2*time.Hour || time.Duration(app.AckWait) != 90*time.Second {
		t.Fatalf("decoded app %+v", app)
	}
	pols := cfg.Apps.TLS.Automation.Policies
	if len(pols) != 2 {
		t.Fatalf("want a site policy and the default one, got %d", len(pols))
	}
	site, def := pols[0].Issuers[0], pols[1].Issuers[0]
	if site.CA != "https://ca.internal/dir" || site.BudgetLimit != 10 || site.BudgetWindow != 0 ||
		len(site.TrustedRootsPEMFiles) != 1 || site.Challenges == nil || site.Challenges.TLSALPN == nil || !site.Challenges.TLSALPN.Disabled {
		t.Fatalf("decoded site issuer %+v", site)
	}
	if def.CA != "https://acme-v02.api.letsencrypt.org/directory" || def.Email != "ops@example.com" ||
		def.BudgetLimit != 40 || time.Duration(def.BudgetWindow) != 72*time.Hour {
		t.Fatalf("decoded default issuer %+v", def)
	}
}

func TestCaddyfileBadInput(t *testing.T) {
	site := func(issuer string) string {
		return "example.com {\n tls {\n  issuer edgeplane {\n" + issuer + "\n  }\n }\n}\n"
	}
	global := func(body string) string { return "{\n edgeplane_certs {\n" + body + "\n }\n}\n" }
	for _, tc := range []struct{ in, want string }{
		{site("budget_limit"), "wrong argument count"},
		{site("budget_limit 0"), "at least 1"},
		{site("budget_limit ten"), "whole number"},
		{site("budget_limit 5 6"), "wrong argument count"},
		{site("budget_window"), "wrong argument count"},
		{site("budget_window -1h"), "positive duration"},
		{site("budget_window soon"), "positive duration"},
		// Unknown options still reach the acme issuer's parser, which
		// names them.
		{site("bogus 1"), "bogus"},
		{global("bogus x"), `unrecognized edgeplane_certs option "bogus"`},
		{global("gateway_name"), "wrong argument count"},
		{global("gateway_name a b"), "wrong argument count"},
		{global("retry_backoff"), "wrong argument count"},
		{global("retry_backoff 0s"), "positive duration"},
		{global("retry_backoff 1h 1m"), "at least 1h0m0s"},
		{global("retry_backoff 1m 1h 2h"), "wrong argument count"},
		{global("ack_wait 1s"), "below the minimum 3s"},
		{global("ack_wait never"), "positive duration"},
		{"{\n edgeplane_certs extra\n}\n", "wrong argument count"},
	} {
		_, err := adapt(t, tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("adapting %q: %v; want an error with %q and the file position", tc.in, err, tc.want)
		}
	}
}
