package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func lookupA(t *testing.T, addr, name string) []string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	var out []string
	for _, rr := range r.Answer {
		out = append(out, rr.(*dns.A).A.String())
	}
	slices.Sort(out)
	return out
}

// start runs the command until the test ends and returns its DNS address.
func start(t *testing.T, args ...string) (string, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, append(args, "--listen", "127.0.0.1:0", "--log-level", "error"), started) }()
	var addr string
	select {
	case addr = <-started:
	case err := <-done:
		t.Fatalf("edgeplane-dns exited: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("edgeplane-dns did not start")
	}
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("edgeplane-dns: %v", err)
		}
	}
	t.Cleanup(func() {
		select {
		case <-ctx.Done():
		default:
			stop()
		}
	})
	return addr, stop
}

// TestStandalone runs the command against a real NATS: it answers a deploy,
// then, restarted while NATS is down, answers from its snapshot.
func TestStandalone(t *testing.T) {
	srv := storetest.Start(t)
	snap := filepath.Join(t.TempDir(), "dns-routing.json")
	ctx := context.Background()
	if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{{ID: "w1", Machine: "m1", Address: "10.100.0.5", Port: 80}}},
	}); err != nil {
		t.Fatal(err)
	}
	addr, stop := start(t, "--nats", srv.URL, "--snapshot", snap, "--zone", "cluster.test")
	storetest.Eventually(t, 10*time.Second, "the deploy in DNS", func() bool {
		return slices.Equal(lookupA(t, addr, "web.shop.cluster.test."), []string{"10.100.0.5"})
	})
	stop()

	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	addr, _ = start(t, "--nats", srv.URL, "--snapshot", snap, "--zone", "cluster.test")
	if got := lookupA(t, addr, "web.shop.cluster.test."); !slices.Equal(got, []string{"10.100.0.5"}) {
		t.Fatalf("from the snapshot with NATS down: %v", got)
	}
}

// TestStandaloneRegion: with --region the command answers a service
// spread over two regions with its own region's instances.
func TestStandaloneRegion(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	ev := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		DeployID: "shop-d1", Revision: 1}
	events := []store.RoutingEvent{}
	for i, m := range []struct{ id, region, addr string }{{"m1", "tyo", "10.1.0.1"}, {"m2", "fra", "10.2.0.1"}} {
		events = append(events, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: &store.MachineRecord{
			Version: store.RecordVersion, ID: m.id, Region: m.region, State: store.MachineActive, Address: m.addr}})
		ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: "w" + m.id, Machine: m.id, Slot: i, Revision: 1,
			Address: m.addr, Port: 80})
	}
	if _, err := srv.Store.PublishRouting(ctx, "shop-d1", append(events, ev)); err != nil {
		t.Fatal(err)
	}
	for region, want := range map[string][]string{"fra": {"10.2.0.1"}, "tyo": {"10.1.0.1"}, "": {"10.1.0.1", "10.2.0.1"}} {
		addr, stop := start(t, "--nats", srv.URL, "--region", region)
		storetest.Eventually(t, 10*time.Second, "the "+region+" server's answer", func() bool {
			return slices.Equal(lookupA(t, addr, "web.shop.edgeplane.internal."), want)
		})
		stop()
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--zone", "."}, "root zone"},
		{[]string{"--forward", "resolver.example"}, "must be an IP address"},
		{[]string{"--ns-address", "nope"}, "--ns-address"},
		{[]string{"--ttl", "0.5s"}, "ttl"},
		{[]string{"--region", "eu.west"}, `--region: region "eu.west": not a DNS label`},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"stray"}, "unexpected arguments"},
	} {
		err := run(context.Background(), tc.args, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

// --help prints the flags and succeeds; a bad flag fails.
func TestHelpSucceeds(t *testing.T) {
	var errb bytes.Buffer
	if code := exitCode(run(context.Background(), []string{"--help"}, nil), &errb); code != 0 {
		t.Fatalf("--help: exit %d, want 0 (%s)", code, errb.String())
	}
	if code := exitCode(run(context.Background(), []string{"--no-such-flag"}, nil), &errb); code != 1 {
		t.Fatalf("--no-such-flag: exit %d, want 1", code)
	}
}
