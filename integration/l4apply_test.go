package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Layer-4 entry points at apply, through the real CLI and control plane:
// a gateway port another namespace owns is refused with port_owned, a
// reserved port with its field path, a passthrough host that is another
// namespace's HTTP host with host_owned; each at preview and apply, with
// nothing written. The owner's port is free once it stops exposing it.
func TestLayer4ApplyRefusals(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	ctx := context.Background()
	data := func(l4 string) string {
		return c.manifest("data.yaml", `
namespace: data
services:
  db:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
`+l4)
	}
	c.mustControl(applyArgs(data("    tcp: [{port: 15432}]\n    tls_passthrough: {hosts: [db.example.com]}\n"))...)
	c.mustControl(applyArgs(c.manifest("shop.yaml", `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
`))...)
	if ps, err := hosts.OwnedPorts(ctx, c.store, "data"); err != nil || len(ps) != 1 || ps[0].Key.String() != "tcp/15432" || ps[0].Service != "db" {
		t.Fatalf("data owns ports %v (%v)", ps, err)
	}
	if hs, _ := hosts.Owned(ctx, c.store, "data"); !slices.Equal(hs, []string{"db.example.com"}) {
		t.Fatalf("data owns hosts %v: its passthrough host is not claimed", hs)
	}
	intruder := func(l4 string) string {
		return c.manifest("test.yaml", `
namespace: test
services:
  web:
    command: ["@HELLO@"]
    readiness: {path: /healthz, timeout: 10s}
`+l4)
	}
	head := routingHead(t, c)
	for _, tc := range []struct {
		name, l4 string
		want     []string
	}{
		{"a port data owns", "    tcp: [{port: 6379}, {port: 15432}]\n", []string{
			"error: port_owned: port tcp/15432 belongs to namespace data (service db); namespace test may not expose it",
			"owner: data\n", "owner_service: db\n", "port: tcp/15432\n", "requester: test\n"}},
		{"the gateway's HTTPS port", "    tcp: [{port: 443}]\n", []string{
			"services.web.tcp[0].port", "tcp/443 is reserved: the gateway's HTTPS port; route TLS to a service there with tls_passthrough"}},
		{"Caddy's admin port", "    tcp: [{port: 6379}, {port: 2019}]\n", []string{"services.web.tcp[1].port", "tcp/2019 is reserved: Caddy's admin API"}},
		{"shop's HTTP host passed through", "    tls_passthrough: {hosts: [Shop.Example.com]}\n", []string{
			"error: host_owned: host shop.example.com belongs to namespace shop", "owner: shop\n", "requester: test\n"}},
		{"data's passthrough host routed", "    routes: [{hosts: [db.example.com]}]\n", []string{
			"error: host_owned: host db.example.com belongs to namespace data", "owner: data\n"}},
	} {
		f := intruder(tc.l4)
		for _, cmd := range [][]string{{"deploy", "preview", "-f", f}, applyArgs(f)} {
			out, errOut, code := c.control(cmd...)
			if code != 1 {
				t.Fatalf("%s, %s: exit %d\nstdout:\n%s\nstderr:\n%s", tc.name, cmd[1], code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Fatalf("%s, %s: stderr lacks %q:\n%s", tc.name, cmd[1], w, errOut)
				}
			}
		}
	}
	// Nothing written: no status, phase, lease, claim or routing event.
	locks := storetest.Bucket(t, c.store, c.store.Names.LocksBucket())
	phases := storetest.Bucket(t, c.store, c.store.Names.DeployPhasesBucket())
	statuses := storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket())
	for name, n := range map[string]int{
		"status": countPrefix(t, statuses, "test."),
		"phases": countPrefix(t, phases, "test."),
		"locks":  countPrefix(t, locks, store.DeployLockKey("test")),
	} {
		if n != 0 {
			t.Fatalf("a refused manifest wrote %d %s records", n, name)
		}
	}
	if hs, _ := hosts.Owned(ctx, c.store, "test"); len(hs) != 0 {
		t.Fatalf("a refused manifest claimed hosts %v", hs)
	}
	if ps, _ := hosts.OwnedPorts(ctx, c.store, "test"); len(ps) != 0 {
		t.Fatalf("a refused manifest claimed ports %v", ps)
	}
	if h := routingHead(t, c); h != head {
		t.Fatalf("routing moved from %d to %d", head, h)
	}
	// data stops exposing its port and passthrough host: both are free.
	c.mustControl(applyArgs(data(""))...)
	if ps, _ := hosts.OwnedPorts(ctx, c.store, "data"); len(ps) != 0 {
		t.Fatalf("data still owns %v after it stopped exposing them", ps)
	}
	c.mustControl(applyArgs(intruder("    tcp: [{port: 15432}]\n    tls_passthrough: {hosts: [db.example.com]}\n"))...)
	ps, _ := hosts.OwnedPorts(ctx, c.store, "test")
	hs, _ := hosts.Owned(ctx, c.store, "test")
	if got := fmt.Sprint(ps, hs); got != "[{tcp/15432 web}] [db.example.com]" {
		t.Fatalf("test owns %s", got)
	}
}
