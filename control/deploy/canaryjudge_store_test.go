package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// gatewayStore connects to n with gateway credentials bound to name, as
// that gateway's Caddy does.
func gatewayStore(t *testing.T, n *storagenode.Node, name string) *store.Store {
	t.Helper()
	b, err := n.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: name})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := store.Connect(store.ConnectOptions{URL: n.Server.ClientURL(), CredsFile: file, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.Open(ctx, nc, n.Store.Names)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// report writes gateway gw's canary counters c of shop/web, deploy d1,
// waiting up to wait for the store's answer.
func report(t *testing.T, s *store.Store, gw string, c *[2]store.RevisionCounts, wait time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return s.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: gw, Since: time.Now().Add(-time.Minute), At: time.Now().UTC(),
		Services: []store.ServiceTraffic{{Namespace: "shop", Service: "web", Latency: make([]uint64, len(store.TrafficLatencyBounds)+1),
			Canary: &store.CanaryTraffic{Deploy: "d1", Old: c[0], New: c[1]}}}})
}

// A canary held against a real store with credentials required, three
// gateways reporting with their own credentials: one of them reports a
// hundred times the others' requests, hiding a bad canary's errors (still
// aborted) or inventing errors for a good one (still promoted). Its
// credentials cannot write another gateway's report to outvote it.
func TestCanaryHoldOutvotesAGatewayReporting100x(t *testing.T) {
	dir := t.TempDir()
	authDir := filepath.Join(dir, "auth")
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		t.Fatal(err)
	}
	// Plain loopback: the credentials carry no CA to ask for TLS with.
	if err := os.RemoveAll(filepath.Join(authDir, "tls")); err != nil {
		t.Fatal(err)
	}
	n, err := storagenode.Boot(t.Context(), storagenode.BootConfig{DataDir: dir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn,
		AuthDir: authDir, TLS: storagenode.ToggleOff, Encrypt: storagenode.ToggleOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	gws := map[string]*store.Store{}
	for _, name := range []string{"gw1", "gw2", "liar"} {
		gws[name] = gatewayStore(t, n, name)
	}
	d := New(n.Store, Options{})
	noLease := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name         string
		honest, liar *[2]store.RevisionCounts
		verdict      store.CanaryVerdict
		says         string
	}{
		{"bad canary, the liar hides its errors", sides(900, 0, 100, 5, 0.004), sides(90_000, 0, 10_000, 0, 0.004),
			store.CanaryAborted, "2 of 3 gateway votes breach"},
		{"good canary, the liar invents errors", sides(900, 0, 100, 0, 0.004), sides(90_000, 0, 10_000, 9_000, 0.004),
			store.CanaryPassed, "2 of 3 gateway votes within limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, gw := range []string{"gw1", "gw2"} {
				if err := report(t, gws[gw], gw, tc.honest, 5*time.Second); err != nil {
					t.Fatalf("%s's own report: %v", gw, err)
				}
			}
			if err := report(t, gws["liar"], "liar", tc.liar, 5*time.Second); err != nil {
				t.Fatalf("the liar's own report: %v", err)
			}
			// Nor can it outvote them by writing their reports: the server
			// refuses the write (no answer comes).
			if err := report(t, gws["liar"], "gw1", tc.liar, time.Second); err == nil {
				t.Fatal("the liar's credentials wrote gw1's report")
			}
			verdict, reason, figs, err := d.holdCanary(t.Context(), "shop", "d1", []string{"web"}, store.CanaryLimits{}, time.Second, 3, noLease)
			if err != nil || verdict != tc.verdict || !strings.Contains(reason, tc.says) {
				t.Fatalf("held: %s %q %v; want %s and %q", verdict, reason, err, tc.verdict, tc.says)
			}
			if len(figs) != 1 || len(figs[0].Votes) != 3 || figs[0].New.Requests != 10_200 {
				t.Fatalf("judged figures %+v: want the three gateways' reports, each voting", figs)
			}
		})
	}
}
