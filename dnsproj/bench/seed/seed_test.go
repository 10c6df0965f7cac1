package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// What the bench seeds is what a gateway or edgeplane-dns accepts: every
// service's routing verifies under the trust root the store names, so the
// DNS figure measures answers, not refusals.
func TestSeedWritesVerifiableRouting(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := seed(ctx, config{dir: dir, listen: "127.0.0.1:0", zone: "edgeplane.internal.", services: 3, instances: 2, nxPercent: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()

	cfg := store.Config{NATSURL: ns.ClientURL(), TrustPinFile: filepath.Join(dir, "pin")}
	s, err := cfg.Dial(ctx, store.ConnectOptions{Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.NC.Close()
	st, err := s.LoadRouting(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 3 || len(st.Skipped) != 0 {
		t.Fatalf("routing: %d services, skipped %v", len(st.Services), st.Skipped)
	}
	hosts, err := os.ReadFile(filepath.Join(dir, "hosts"))
	if err != nil || strings.Count(string(hosts), "\n") != 6 {
		t.Fatalf("hosts file (%v):\n%s", err, hosts)
	}
}
