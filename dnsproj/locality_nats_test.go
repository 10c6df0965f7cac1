package dnsproj

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// TestRegionsOverNATS runs a resolver in tyo and one in fra on one real
// projection fed by a real embedded NATS: each answers its own region
// first; a region drained by a routing event is left by the next answer
// after the projection applies it; a region whose machines stop beating
// falls over to the next region and comes back when they beat again; a
// strict service with no instance in a resolver's region is NODATA there.
func TestRegionsOverNATS(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	p, err := projection.New(projection.Config{Store: srv.Store})
	if err != nil {
		t.Fatal(err)
	}
	runProjection(t, p)
	resolvers := map[string]string{}
	for _, region := range []string{"tyo", "fra"} {
		_, resolvers[region] = startServer(t, Config{Region: region}, ProjectionSource(p))
	}

	var events []store.RoutingEvent
	now := time.Now().UTC()
	for _, m := range regionMachines {
		m.Version, m.State, m.JoinedAt, m.UpdatedAt = store.RecordVersion, store.MachineActive, now, now
		if err := srv.Store.CreateMachine(ctx, &m); err != nil {
			t.Fatal(err)
		}
		events = append(events, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: &m, At: now})
	}
	soloEv := spread("solo", &store.Locality{Policy: store.LocalityStrict})
	soloEv.Endpoints = soloEv.Endpoints[2:4] // fra's only
	events = append(events, spread("web", nil), soloEv)
	seq, err := srv.Store.PublishRouting(ctx, "shop-d1", events)
	if err != nil {
		t.Fatal(err)
	}

	// Every machine beats, and the control server's aggregator judges.
	const interval = 200 * time.Millisecond
	var mu sync.Mutex
	beating := map[string]bool{}
	for _, m := range regionMachines {
		beating[m.ID] = true
	}
	bctx, stopBeats := context.WithCancel(ctx)
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			mu.Lock()
			for m, on := range beating {
				if on {
					_ = srv.Store.PutMachineBeat(bctx, m, interval)
				}
			}
			mu.Unlock()
			select {
			case <-bctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { stopBeats(); <-beatsDone })
	agg, err := fleet.New(srv.Store, fleet.Config{FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgg := context.WithCancel(ctx)
	aggDone := make(chan struct{})
	go func() { defer close(aggDone); _ = agg.Run(actx) }()
	t.Cleanup(func() { stopAgg(); <-aggDone })
	waitSeq(t, p, seq)

	const web, solo = "web.shop.edgeplane.internal.", "solo.shop.edgeplane.internal."
	tyo, fra, nyc := []string{"10.1.0.1", "10.1.0.2"}, []string{"10.2.0.1", "10.2.0.2"}, []string{"10.3.0.1", "10.3.0.2"}
	a := func(region, name string) []string {
		return aSummary(ask(t, "udp", resolvers[region], query(name, dns.TypeA)).Answer)
	}
	answering := func(region string, want []string) func() bool {
		return func() bool { return slices.Equal(a(region, web), want) }
	}
	for region, want := range map[string][]string{"tyo": tyo, "fra": fra} {
		if got := a(region, web); !slices.Equal(got, want) {
			t.Fatalf("%s resolver: A %v, want %v", region, got, want)
		}
	}
	if got := srvSummary(ask(t, "tcp", resolvers["tyo"], query(web, dns.TypeSRV)).Answer); !slices.Equal(got, []string{
		"0 web-tyo-1", "0 web-tyo-2", "1 web-fra-1", "1 web-fra-2", "2 web-nyc-1", "2 web-nyc-2"}) {
		t.Fatalf("tyo resolver: SRV %v", got)
	}
	if got := a("fra", solo); !slices.Equal(got, fra) {
		t.Fatalf("fra resolver, strict service in fra: A %v", got)
	}
	r := ask(t, "udp", resolvers["tyo"], query(solo, dns.TypeA))
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 || len(r.Ns) == 0 {
		t.Fatalf("tyo resolver, strict service in fra only: %s %v, want NODATA", dns.RcodeToString[r.Rcode], r.Answer)
	}

	// fra drained, then disabled: both resolvers leave it, within one
	// routing change.
	for _, step := range []struct {
		state    string
		tyo, fra []string
	}{
		{store.RegionDraining, tyo, nyc},
		{store.RegionDisabled, tyo, nyc},
		{store.RegionActive, tyo, fra},
	} {
		seq, err := srv.Store.SetRegionState(ctx, store.RegionRecord{Name: "fra", State: step.state, By: "test"})
		if err != nil {
			t.Fatal(err)
		}
		set := time.Now()
		// Draining and disabled fra answer alike here: the answers alone
		// cannot tell that the second change landed, the view can.
		storetest.Eventually(t, 5*time.Second, "fra "+step.state+" in both resolvers' answers", func() bool {
			return p.View().Seq >= seq && answering("tyo", step.tyo)() && answering("fra", step.fra)()
		})
		t.Logf("fra %s: both resolvers answer by it %s after the event was stored", step.state, time.Since(set).Round(time.Millisecond))
	}

	// tyo's machines stop beating: its resolver falls over to fra (the
	// next region) and comes home when they beat again; no routing event.
	before := p.View().Seq
	mu.Lock()
	beating["tyo-1"], beating["tyo-2"] = false, false
	mu.Unlock()
	storetest.Eventually(t, 10*time.Second, "tyo's resolver to answer fra while tyo is down", answering("tyo", fra))
	if got := srvSummary(ask(t, "tcp", resolvers["tyo"], query(web, dns.TypeSRV)).Answer); !slices.Equal(got, []string{
		"1 web-fra-1", "1 web-fra-2", "2 web-nyc-1", "2 web-nyc-2"}) {
		t.Fatalf("tyo resolver with tyo down: SRV %v", got)
	}
	mu.Lock()
	beating["tyo-1"], beating["tyo-2"] = true, true
	mu.Unlock()
	storetest.Eventually(t, 10*time.Second, "tyo's resolver back home", answering("tyo", tyo))
	if v := p.View(); v.Seq != before {
		t.Fatalf("liveness moved the routing sequence to %d", v.Seq)
	}
}
