package caddydns

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/caddymodule" // the gateway app, "edgeplane"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestMain(m *testing.M) {
	// Caddy keeps data under HOME/XDG dirs: a temp dir, never the machine's.
	dir, err := os.MkdirTemp("", "edgeplane-caddydns-")
	if err != nil {
		panic(err)
	}
	for _, k := range []string{"HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"} {
		os.Setenv(k, dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr finds a loopback port free for both UDP and TCP.
func freeAddr(t *testing.T) string {
	t.Helper()
	for i := 0; i < 20; i++ {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := pc.LocalAddr().String()
		ln, err := net.Listen("tcp", addr)
		pc.Close()
		if err == nil {
			ln.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

func lookup(proto, addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	r, _, err := (&dns.Client{Net: proto, Timeout: 2 * time.Second}).Exchange(m, addr)
	return r, err
}

func answerSet(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	slices.Sort(out)
	return out
}

func config(natsURL, snapshot, dnsAddr, ttl string) []byte {
	return []byte(fmt.Sprintf(`{
		"admin": {"disabled": true, "config": {"persist": false}},
		"apps": {
			"edgeplane": {"nats_url": %q, "snapshot_path": %q, "gateway_name": "dns-test"},
			"edgeplane_dns": {"listen": [%q], "ttl": %q}
		}
	}`, natsURL, snapshot, dnsAddr, ttl))
}

// TestCaddyApp runs the app inside a real Caddy with the real gateway app
// over a real NATS: it answers a deploy and a redeploy from the gateway's
// projection, and keeps answering through a config reload without losing
// a query.
func TestCaddyApp(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	addr := freeAddr(t)
	snap := filepath.Join(t.TempDir(), "routing.json")
	if err := caddy.Load(config(srv.URL, snap, addr, "5s"), true); err != nil {
		t.Fatalf("loading caddy config: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	const name = "web.shop.edgeplane.internal."
	deploy := func(ips ...string) {
		t.Helper()
		var insts []storetest.Instance
		for i, ip := range ips {
			insts = append(insts, storetest.Instance{ID: fmt.Sprintf("w%d-%s", i, strings.ReplaceAll(ip, ".", "-")), Machine: "m-" + strings.ReplaceAll(ip, ".", "-"), Address: ip, Port: 8080})
		}
		if _, _, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": {Instances: insts}}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(ttl int, ips ...string) []string {
		var out []string
		for _, ip := range ips {
			out = append(out, fmt.Sprintf("%s %d IN A %s", name, ttl, ip))
		}
		slices.Sort(out)
		return out
	}
	waitFor := func(proto string, expect []string) {
		t.Helper()
		storetest.Eventually(t, 10*time.Second, fmt.Sprintf("%s answer %q", proto, expect), func() bool {
			r, err := lookup(proto, addr, name, dns.TypeA)
			return err == nil && slices.Equal(answerSet(r), expect)
		})
	}

	deploy("10.100.0.5", "10.100.0.6")
	waitFor("udp", want(5, "10.100.0.5", "10.100.0.6"))
	waitFor("tcp", want(5, "10.100.0.5", "10.100.0.6"))
	deploy("10.100.0.7")
	waitFor("udp", want(5, "10.100.0.7"))

	// Reload with another TTL while a client keeps asking over UDP and TCP:
	// the sockets are handed over, not reopened, so nothing is lost.
	var asked, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			proto := []string{"udp", "tcp"}[i%2]
			asked.Add(1)
			if r, err := lookup(proto, addr, name, dns.TypeA); err != nil || len(r.Answer) != 1 {
				failed.Add(1)
				t.Logf("%s query across the reload: %v %v", proto, err, r)
			}
		}
	}()
	storetest.Eventually(t, 5*time.Second, "queries before the reload", func() bool { return asked.Load() > 20 })
	if err := caddy.Load(config(srv.URL, snap, addr, "7s"), true); err != nil {
		t.Fatalf("reloading: %v", err)
	}
	n := asked.Load()
	storetest.Eventually(t, 5*time.Second, "queries after the reload", func() bool { return asked.Load() > n+20 })
	close(stop)
	<-done
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d of %d queries failed across the reload", f, asked.Load())
	}
	waitFor("udp", want(7, "10.100.0.7"))
}

// TestCaddyAppRegion: inside Caddy, DNS answers a service spread over
// regions with its region's instances first: the region configured, else
// the gateway app's (the region of its machine, gateway_name), when that
// app offers it (RegionFor).
func TestCaddyAppRegion(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	web := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		DeployID: "shop-d1", Revision: 1}
	var events []store.RoutingEvent
	for i, m := range []struct{ id, region, addr string }{
		{"tyo-1", "tyo", "10.1.0.1"}, {"fra-1", "fra", "10.2.0.1"}, {"nyc-1", "nyc", "10.3.0.1"},
	} {
		events = append(events, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: &store.MachineRecord{
			Version: store.RecordVersion, ID: m.id, Region: m.region, State: store.MachineActive, Address: m.addr}})
		web.Endpoints = append(web.Endpoints, store.Endpoint{InstanceID: "web-" + m.id, Machine: m.id, Slot: i, Revision: 1,
			Address: m.addr, Port: 8080})
	}
	if _, err := srv.Store.PublishRouting(ctx, "shop-d1", append(events, web)); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	snap := filepath.Join(t.TempDir(), "routing.json")
	load := func(dnsRegion string) {
		t.Helper()
		cfg := fmt.Sprintf(`{
			"admin": {"disabled": true, "config": {"persist": false}},
			"apps": {
				"edgeplane": {"nats_url": %q, "snapshot_path": %q, "gateway_name": "fra-1"},
				"edgeplane_dns": {"listen": [%q], "region": %q}
			}
		}`, srv.URL, snap, addr, dnsRegion)
		if err := caddy.Load([]byte(cfg), true); err != nil {
			t.Fatalf("loading caddy config: %v", err)
		}
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	answersA := func(want ...string) {
		t.Helper()
		storetest.Eventually(t, 10*time.Second, fmt.Sprintf("A %v", want), func() bool {
			r, err := lookup("udp", addr, "web.shop.edgeplane.internal.", dns.TypeA)
			if err != nil {
				return false
			}
			var got []string
			for _, rr := range r.Answer {
				got = append(got, rr.(*dns.A).A.String())
			}
			slices.Sort(got)
			return slices.Equal(got, want)
		})
	}
	load("nyc")
	answersA("10.3.0.1")

	var gw any = new(caddymodule.App)
	if _, ok := gw.(regionProvider); !ok {
		t.Skip("the edgeplane app offers no RegionFor: DNS inside Caddy has the region configured only")
	}
	load("")
	answersA("10.2.0.1")
}

// TestAppConfigErrors shows bad JSON config rejected with a clear error.
func TestAppConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		app  App
		want string
	}{
		{App{Listen: []string{"127.0.0.1:1053-1060"}}, "one port"},
		{App{Listen: []string{"unix//tmp/dns.sock"}}, "UDP and TCP"},
		{App{NSAddresses: []string{"ns.example"}}, "ns address"},
		{App{Zone: "."}, "root zone"},
		{App{Region: "eu west"}, `region "eu west": not a DNS label`},
		{App{TTL: caddy.Duration(time.Millisecond)}, "ttl"},
		{App{Forward: &Forward{To: []string{"resolver.example"}}}, "must be an IP address"},
		{App{Forward: &Forward{To: []string{"1.1.1.1"}, Policy: "fastest"}}, "policy"},
		{App{Cache: &Cache{Size: -1}}, "cache"},
	} {
		a := tc.app
		err := a.validateAll()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to mention %q", tc.app, err, tc.want)
		}
	}
	if err := (&App{}).validateAll(); err != nil {
		t.Errorf("defaults rejected: %v", err)
	}
}
