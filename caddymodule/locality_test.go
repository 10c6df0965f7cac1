package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// regional is one instance of a regional service: its backend, on a
// machine of its own in region.
type regional struct {
	b       *backend
	region  string
	revised bool // of the split's new revision
}

func inRegion(b *backend, region string) regional { return regional{b: b, region: region} }

// machineOf is the machine an instance of the fixture runs on.
func machineOf(r regional) string { return "m-" + r.b.name }

// publishRegional publishes, as admission and a deploy do, a machine
// upsert per instance (in its region) and the upsert of ns/name routed at
// host with loc and split, and returns the last routing sequence.
func (f *fixture) publishRegional(ns, name, host string, loc *store.Locality, split *store.Split, insts ...regional) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now().UTC()
	var evs []store.RoutingEvent
	svc := store.RoutingEvent{Version: store.RecordVersion, Kind: store.EventServiceUpsert, Namespace: ns, Service: name,
		DeployID: ns + "-" + name, Revision: 1, Routes: []store.Route{{Hosts: []string{host}}}, Locality: loc, Split: split, At: now}
	for i, in := range insts {
		m := &store.MachineRecord{Version: store.RecordVersion, ID: machineOf(in), State: store.MachineActive, Address: in.b.host,
			Region: in.region, JoinedAt: now, UpdatedAt: now}
		evs = append(evs, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: m, At: now})
		rev := int64(1)
		if in.revised {
			rev = 2
		}
		svc.Endpoints = append(svc.Endpoints, store.Endpoint{InstanceID: in.b.name, Machine: m.ID, Slot: i, Revision: rev,
			Address: in.b.host, Port: in.b.port})
	}
	seq, err := f.nats.Store.PublishRouting(ctx, "", append(evs, svc))
	if err != nil {
		f.t.Fatalf("publishing %s/%s: %v", ns, name, err)
	}
	return seq
}

// setRegion sets region's state and returns the routing sequence.
func (f *fixture) setRegion(name, state string) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seq, err := f.nats.Store.SetRegionState(ctx, store.RegionRecord{Name: name, State: state, By: "test", UpdatedAt: time.Now().UTC()})
	if err != nil {
		f.t.Fatalf("setting region %s %s: %v", name, state, err)
	}
	return seq
}

// setDown writes the liveness judgement with machines down (none: every
// machine beats).
func (f *fixture) setDown(machines ...string) {
	f.t.Helper()
	down := map[string]store.MachineDown{}
	for _, m := range machines {
		down[m] = store.MachineDown{Liveness: store.MachineOffline, LastBeat: time.Now().Add(-time.Minute), Interval: time.Second}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.nats.Store.PutLiveness(ctx, &store.LivenessRecord{At: time.Now(), Down: down}); err != nil {
		f.t.Fatal(err)
	}
}

// backendsOf sends n requests to host and returns the backends that
// answered, sorted, and the first failure if any.
func (f *fixture) backendsOf(host string, n int) (backends []string, failed string) {
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		r, err := f.get(host, "/")
		if err != nil || r.status != http.StatusOK {
			if failed == "" {
				failed = fmt.Sprintf("status %d body %q err %v", r.status, r.body, err)
			}
			continue
		}
		seen[r.backend] = true
	}
	for b := range seen {
		backends = append(backends, b)
	}
	sort.Strings(backends)
	return backends, failed
}

// eventuallyServedBy waits until every one of 20 requests to host is
// answered by one of want, and all of want answer.
func (f *fixture) eventuallyServedBy(host string, want ...string) {
	f.t.Helper()
	sort.Strings(want)
	var got []string
	var failed string
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		got, failed = f.backendsOf(host, 20)
		if failed == "" && strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("%s: served by %v (failure %s), want %v", host, got, failed, want)
}

// newRegionalFixture is a gateway in region home (none for "") probing
// every 200ms, with tyo-1, tyo-2, fra-1 and nyc-1 deployed as web.test
// under loc.
func newRegionalFixture(t *testing.T, home string, loc *store.Locality) (*fixture, map[string]*backend) {
	f := newFixture(t)
	f.app = map[string]any{"health_interval": int64(200 * time.Millisecond), "health_timeout": int64(200 * time.Millisecond)}
	if home != "" {
		f.app["region"] = home
	}
	bs := map[string]*backend{}
	var insts []regional
	for _, n := range []string{"tyo-1", "tyo-2", "fra-1", "nyc-1"} {
		bs[n] = newBackend(t, n)
		insts = append(insts, inRegion(bs[n], strings.Split(n, "-")[0]))
	}
	seq := f.publishRegional("shop", "web", "web.test", loc, nil, insts...)
	f.load()
	f.waitSeq(seq)
	return f, bs
}

func TestLocalityPrefersHomeAndFailsOverByOrder(t *testing.T) {
	f, _ := newRegionalFixture(t, "tyo", &store.Locality{Order: []string{"nyc", "fra"}})
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")

	// Both home machines down: the next region in the service's order.
	f.setDown(machineOf(regional{b: &backend{name: "tyo-1"}}), machineOf(regional{b: &backend{name: "tyo-2"}}))
	f.eventuallyServedBy("web.test", "nyc-1")
	if ri := f.routeOf("web"); ri.Serving == nil || ri.Serving.Region != "nyc" || strings.Join(ri.Serving.Instances, ",") != "nyc-1" {
		t.Errorf("admin routes while nyc serves: %+v", ri.Serving)
	}
	// And nyc too: fra.
	f.setDown("m-tyo-1", "m-tyo-2", "m-nyc-1")
	f.eventuallyServedBy("web.test", "fra-1")
	// Every machine down: fail open on the first tier, home.
	f.setDown("m-tyo-1", "m-tyo-2", "m-nyc-1", "m-fra-1")
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")
	// One home machine back: home again.
	f.setDown("m-tyo-2", "m-nyc-1", "m-fra-1")
	f.eventuallyServedBy("web.test", "tyo-1")
	f.setDown()
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")
	// fra-1's machine moves to tyo: one more at home.
	now := time.Now().UTC()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, At: now,
		Machine: &store.MachineRecord{Version: store.RecordVersion, ID: "m-fra-1", State: store.MachineActive, Address: "127.0.0.1", Region: "tyo", JoinedAt: now, UpdatedAt: now}}})
	if err != nil {
		t.Fatal(err)
	}
	f.waitSeq(seq)
	f.eventuallyServedBy("web.test", "fra-1", "tyo-1", "tyo-2")

	// The requests went to the regions counted.
	var got map[string]uint64
	for _, s := range current.Load().shared.traffic.snapshot(0) {
		if s.Service == "web" {
			got = s.ByRegion
		}
	}
	if got["tyo"] == 0 || got["nyc"] == 0 || got["fra"] == 0 {
		t.Errorf("requests by region: %v, want some in tyo, nyc and fra", got)
	}
	_, body := f.adminGet("/metrics")
	if want := `edgeplane_gateway_requests_by_region_total{gateway_region="tyo",instance_region="nyc",namespace="shop",service="web"}`; !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %s", want)
	}
}

func TestLocalityHealthProbesMoveToNearestByName(t *testing.T) {
	f, bs := newRegionalFixture(t, "tyo", nil)
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")
	// Both home instances fail their probes: the other regions by name
	// (none measured nearer), fra first.
	bs["tyo-1"].srv.Close()
	bs["tyo-2"].srv.Close()
	f.eventuallyServedBy("web.test", "fra-1")
}

func TestLocalityStrict(t *testing.T) {
	f, _ := newRegionalFixture(t, "osa", &store.Locality{Policy: store.LocalityStrict})
	r := f.mustGet("web.test", "/")
	if r.status != http.StatusServiceUnavailable || r.body != "service unavailable: no instance of shop/web in region osa (locality strict)\n" {
		t.Errorf("strict without a home instance: %d %q", r.status, r.body)
	}
	resp, err := f.client.Do(mustRequest(t, f, "web.test"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Edgeplane-Reason"); got != "locality-strict" {
		t.Errorf("Edgeplane-Reason %q", got)
	}

	// A gateway in tyo serves tyo only, even with tyo's machines down
	// (fail open within home), and nothing once tyo is disabled.
	f.app["region"] = "tyo"
	f.load()
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")
	f.setDown("m-tyo-1", "m-tyo-2")
	for i := 0; i < 10; i++ {
		if r := f.mustGet("web.test", "/"); r.status != 200 || !strings.HasPrefix(r.backend, "tyo-") {
			t.Fatalf("strict with home down: %d from %q", r.status, r.backend)
		}
	}
	f.waitSeq(f.setRegion("tyo", store.RegionDisabled))
	if r := f.mustGet("web.test", "/"); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "region tyo is disabled") {
		t.Errorf("strict in a disabled region: %d %q", r.status, r.body)
	}
}

// routeOf is service's entry in /edgeplane/routes.
func (f *fixture) routeOf(service string) RouteInfo {
	f.t.Helper()
	code, body := f.adminGet("/edgeplane/routes")
	var routes []RouteInfo
	if err := json.Unmarshal(body, &routes); err != nil || code != 200 {
		f.t.Fatalf("routes: %d %s", code, body)
	}
	for _, r := range routes {
		if r.Service == service {
			return r
		}
	}
	f.t.Fatalf("routes lack %s: %s", service, body)
	return RouteInfo{}
}

func mustRequest(t *testing.T, f *fixture, host string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, "http://"+f.gateway+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	return req
}

func TestLocalityDrainedServesOnlyWhenNothingElseCan(t *testing.T) {
	f, _ := newRegionalFixture(t, "fra", nil)
	f.eventuallyServedBy("web.test", "fra-1")
	// Drained home: the active regions one by one (by name, none
	// measured), nyc first.
	f.waitSeq(f.setRegion("fra", store.RegionDraining))
	f.eventuallyServedBy("web.test", "nyc-1")
	f.setDown("m-nyc-1")
	f.eventuallyServedBy("web.test", "tyo-1", "tyo-2")
	f.setDown("m-tyo-1", "m-tyo-2", "m-nyc-1")
	f.eventuallyServedBy("web.test", "fra-1")
	f.setDown()
	f.eventuallyServedBy("web.test", "nyc-1")
	f.waitSeq(f.setRegion("fra", store.RegionActive))
	f.eventuallyServedBy("web.test", "fra-1")
}

func TestLocalityDisabledNever(t *testing.T) {
	f, _ := newRegionalFixture(t, "nyc", nil)
	f.eventuallyServedBy("web.test", "nyc-1")
	f.waitSeq(f.setRegion("nyc", store.RegionDisabled))
	f.eventuallyServedBy("web.test", "fra-1")
	// Every other machine down: fail open on the first tier, never nyc.
	f.setDown("m-tyo-1", "m-tyo-2", "m-fra-1")
	f.eventuallyServedBy("web.test", "fra-1")

	// A service all in disabled regions: 503 with the reason.
	f.waitSeq(f.setRegion("fra", store.RegionDisabled))
	f.waitSeq(f.setRegion("tyo", store.RegionDisabled))
	r := f.mustGet("web.test", "/")
	if r.status != http.StatusServiceUnavailable || r.body != "service unavailable: every instance of shop/web is in a disabled region (fra, nyc, tyo)\n" {
		t.Errorf("all disabled: %d %q", r.status, r.body)
	}
	if ri := f.routeOf("web"); ri.Serving != nil || !strings.Contains(ri.Unavailable, "disabled region") {
		t.Errorf("admin routes with every region disabled: %+v %q", ri.Serving, ri.Unavailable)
	}
}

func TestLocalityCanarySplitWithinHome(t *testing.T) {
	f := newFixture(t)
	f.app = map[string]any{"region": "tyo"}
	old, fresh, farOld, farNew := newBackend(t, "tyo-old"), newBackend(t, "tyo-new"), newBackend(t, "fra-old"), newBackend(t, "fra-new")
	split := &store.Split{Deploy: "d2", Revision: 2, From: 1, Weight: 50}
	seq := f.publishRegional("shop", "web", "web.test", nil, split, inRegion(old, "tyo"), regional{b: fresh, region: "tyo", revised: true},
		inRegion(farOld, "fra"), regional{b: farNew, region: "fra", revised: true})
	f.load()
	f.waitSeq(seq)
	f.eventuallyServedBy("web.test", "tyo-new", "tyo-old")

	// A tier with only the old side: the new side's requests go to the
	// whole tier rather than to another region.
	only := newBackend(t, "tyo-only")
	f.waitSeq(f.publishRegional("shop", "web", "web.test", nil, split, inRegion(only, "tyo"), regional{b: farNew, region: "fra", revised: true}))
	f.eventuallyServedBy("web.test", "tyo-only")
}

func TestRegionFromMachineInAdminAndReports(t *testing.T) {
	f := newFixture(t)
	w := newBackend(t, "web-1")
	f.publishRegional("shop", "web", "web.test", nil, nil, inRegion(w, "fra"))
	// The gateway beside an agent: a machine named as the gateway.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now().UTC()
	seq, err := f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, At: now,
		Machine: &store.MachineRecord{Version: store.RecordVersion, ID: "gw-test", State: store.MachineActive, Address: "127.0.0.9", Region: "sgp", JoinedAt: now, UpdatedAt: now}}})
	if err != nil {
		t.Fatal(err)
	}
	f.app = map[string]any{"traffic_interval": int64(200 * time.Millisecond)}
	f.load()
	f.waitSeq(seq)

	status := func() GatewayStatus {
		t.Helper()
		code, body := f.adminGet("/edgeplane/projection")
		var st GatewayStatus
		if err := json.Unmarshal(body, &st); err != nil || code != 200 {
			t.Fatalf("projection: %d %s", code, body)
		}
		return st
	}
	if st := status(); st.Region != "sgp" || st.RegionSource != regionFromMachine || st.State != "serving" {
		t.Errorf("region from the machine: %+v", st)
	}
	// No instance at home: the other region serves (prefer).
	f.eventuallyServedBy("web.test", "web-1")

	storetest.Eventually(t, wait, "observation and traffic report carrying the region", func() bool {
		var obs, rep bool
		_ = f.nats.Store.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
			obs = obs || o.Gateway == "gw-test" && o.Region == "sgp"
			return nil
		})
		_ = f.nats.Store.ListGatewayTraffic(ctx, func(g *store.GatewayTraffic) error {
			for _, s := range g.Services {
				rep = rep || g.Gateway == "gw-test" && g.Region == "sgp" && s.Service == "web" && s.ByRegion["fra"] > 0
			}
			return nil
		})
		return obs && rep
	})

	// The machine moves to fra: the gateway follows, and web-1 is home.
	now = time.Now().UTC()
	seq, err = f.nats.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert, At: now,
		Machine: &store.MachineRecord{Version: store.RecordVersion, ID: "gw-test", State: store.MachineActive, Address: "127.0.0.9", Region: "fra", JoinedAt: now, UpdatedAt: now}}})
	if err != nil {
		t.Fatal(err)
	}
	f.waitSeq(seq)
	if st := status(); st.Region != "fra" || st.RegionSource != regionFromMachine {
		t.Errorf("region after the machine moved: %+v", st)
	}

	f.app["region"] = "tyo"
	f.load()
	if st := status(); st.Region != "tyo" || st.RegionSource != regionFromConfig {
		t.Errorf("region from config: %+v", st)
	}
}
