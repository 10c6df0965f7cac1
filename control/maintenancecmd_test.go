package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// control maintenance, against a real store: an unknown namespace is a
// clear error and publishes nothing; on stores one signed event (its
// sequence in the JSON) that `maintenance ls` shows; off says so.
func TestMaintenanceCommands(t *testing.T) {
	srv := storetest.Start(t)
	s := srv.Store
	ctx := t.Context()
	if _, err := s.AppendCommit(ctx, &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {Command: []string{"true"}}}}}); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string, string) {
		return runCLI(t, append(args, "--nats", srv.URL, "--signing-key", srv.SignerFile())...)
	}
	head := func() uint64 {
		info, err := s.RoutingInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before := head()
	code, _, errOut := cli("maintenance", "on", "blog")
	if code != 1 || !strings.Contains(errOut, `error: not_found: unknown namespace "blog": no live deploy (namespaces: shop)`) {
		t.Fatalf("on for an unknown namespace: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut = cli("maintenance", "on", "shop", "db"); code != 1 || !strings.Contains(errOut, `namespace shop has no service "db" (services: web)`) {
		t.Fatalf("on for an unknown service: exit %d, stderr %q", code, errOut)
	}
	if head() != before {
		t.Fatalf("a refused change published: routing head %d, was %d", head(), before)
	}
	code, out, errOut := cli("maintenance", "on", "shop", "web", "--message", "<b>upgrading</b>", "--retry-after", "90s", "-o", "json")
	var ch maintenance.Change
	if code != 0 || json.Unmarshal([]byte(out), &ch) != nil {
		t.Fatalf("on shop web: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if !ch.Changed || ch.Seq != head() || !ch.Record.On || ch.Record.Message != "<b>upgrading</b>" || time.Duration(ch.Record.RetryAfter) != 90*time.Second {
		t.Fatalf("on shop web: %+v (head %d)", ch, head())
	}
	code, out, _ = runCLI(t, "maintenance", "ls", "--nats", srv.URL)
	if code != 0 || !strings.Contains(out, "NAMESPACE") || !strings.Contains(out, "shop       web      on           1m30s") || !strings.Contains(out, "<b>upgrading</b>") {
		t.Fatalf("maintenance ls: exit %d\n%s", code, out)
	}
	code, out, _ = cli("maintenance", "off", "shop", "web")
	if code != 0 || !strings.Contains(out, "shop/web is out of maintenance") {
		t.Fatalf("off shop web: exit %d, %q", code, out)
	}
	code, out, _ = cli("maintenance", "off", "shop", "web")
	if code != 0 || out != "shop/web is not under maintenance; nothing changed\n" {
		t.Fatalf("off again: exit %d, %q", code, out)
	}
}
