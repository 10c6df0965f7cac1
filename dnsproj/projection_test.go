package dnsproj

import (
	"context"
	"errors"
	"path/filepath"
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

// runProjection runs p until the test ends.
func runProjection(t *testing.T, p *projection.Projection) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

func waitSeq(t *testing.T, p *projection.Projection, seq uint64) {
	t.Helper()
	storetest.Eventually(t, 10*time.Second, "projection to apply the routing events", func() bool {
		v := p.View()
		return v.Seq >= seq && !v.Stale
	})
}

func answers(t *testing.T, proto, addr, name string, qtype uint16) (int, []string) {
	t.Helper()
	r := ask(t, proto, addr, query(name, qtype))
	return r.Rcode, rrStrings(r.Answer)
}

// TestProjectionOverNATS drives the zone from a real projection fed by a
// real embedded NATS: deploys, a redeploy with new addresses, a draining
// instance, machines; then NATS goes away and answers keep coming from the
// last good view, also after a restart from the local snapshot.
func TestProjectionOverNATS(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	snap := filepath.Join(t.TempDir(), "routing.snapshot")
	p, err := projection.New(projection.Config{Store: srv.Store, SnapshotPath: snap})
	if err != nil {
		t.Fatal(err)
	}
	stopProjection := runProjection(t, p)
	_, addr := startServer(t, Config{}, ProjectionSource(p))
	const web = "web.shop.edgeplane.internal."

	// Before anything is deployed: NXDOMAIN.
	if rc, _ := answers(t, "udp", addr, web, dns.TypeA); rc != dns.RcodeNameError {
		t.Fatalf("before deploy: %s", dns.RcodeToString[rc])
	}

	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{
			{ID: "web-a", Machine: "m1", Address: "10.100.0.5", Port: 8080},
			{ID: "web-b", Machine: "m2", Address: "10.100.0.6", Port: 8080},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mseq, err := srv.Store.PublishRouting(ctx, "", []store.RoutingEvent{{Kind: store.EventMachineUpsert,
		Machine: &store.MachineRecord{Version: store.RecordVersion, ID: "m1", Address: "10.100.0.5", State: store.MachineActive}}})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p, max(seq, mseq))
	// Once the view has the events, the very next answer shows them.
	if _, got := answers(t, "udp", addr, web, dns.TypeA); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN A 10.100.0.5", "web.shop.edgeplane.internal. 5 IN A 10.100.0.6"}) {
		t.Fatalf("after deploy: %q", got)
	}
	if _, got := answers(t, "tcp", addr, web, dns.TypeSRV); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 web-a.web.shop.edgeplane.internal.",
		"web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 web-b.web.shop.edgeplane.internal."}) {
		t.Fatalf("SRV after deploy: %q", got)
	}
	if _, got := answers(t, "udp", addr, "m1.machines.edgeplane.internal.", dns.TypeA); !slices.Equal(got, []string{
		"m1.machines.edgeplane.internal. 5 IN A 10.100.0.5"}) {
		t.Fatalf("machine: %q", got)
	}

	// Redeploy with new instances: new addresses served, old ones gone.
	_, seq, err = storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{
			{ID: "web-c", Machine: "m1", Address: "10.100.0.7", Port: 8080},
			{ID: "web-d", Machine: "m2", Address: "10.100.0.8", Port: 8080},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p, seq)
	if _, got := answers(t, "udp", addr, web, dns.TypeA); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN A 10.100.0.7", "web.shop.edgeplane.internal. 5 IN A 10.100.0.8"}) {
		t.Fatalf("after redeploy: %q", got)
	}
	if rc, _ := answers(t, "udp", addr, "web-a.web.shop.edgeplane.internal.", dns.TypeA); rc != dns.RcodeNameError {
		t.Fatalf("old instance after redeploy: %s", dns.RcodeToString[rc])
	}

	// An instance starts draining: it leaves DNS at once.
	seq, err = storetest.SetInstance(ctx, srv.Store, "shop", "web-d", store.InstanceDraining, "")
	if err != nil {
		t.Fatal(err)
	}
	waitSeq(t, p, seq)
	if _, got := answers(t, "udp", addr, web, dns.TypeA); !slices.Equal(got, []string{"web.shop.edgeplane.internal. 5 IN A 10.100.0.7"}) {
		t.Fatalf("after drain: %q", got)
	}

	// NATS goes away: the view turns stale and answers keep coming.
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	storetest.Eventually(t, 10*time.Second, "projection to notice NATS is gone", func() bool { return p.View().Stale })
	for _, proto := range []string{"udp", "tcp"} {
		if _, got := answers(t, proto, addr, web, dns.TypeA); !slices.Equal(got, []string{"web.shop.edgeplane.internal. 5 IN A 10.100.0.7"}) {
			t.Fatalf("%s with NATS gone: %q", proto, got)
		}
	}

	// Restart while NATS is still gone: the snapshot serves.
	stopProjection() // writes the final snapshot
	p2, err := projection.New(projection.Config{SnapshotPath: snap,
		Connect: func(context.Context) (*store.Store, error) { return nil, errors.New("nats is down") }})
	if err != nil {
		t.Fatal(err)
	}
	runProjection(t, p2)
	_, addr2 := startServer(t, Config{}, ProjectionSource(p2))
	if !p2.View().Stale {
		t.Fatal("snapshot view not marked stale")
	}
	if _, got := answers(t, "udp", addr2, web, dns.TypeA); !slices.Equal(got, []string{"web.shop.edgeplane.internal. 5 IN A 10.100.0.7"}) {
		t.Fatalf("restarted from snapshot: %q", got)
	}
	if _, got := answers(t, "udp", addr2, "m1.machines.edgeplane.internal.", dns.TypeA); len(got) != 1 {
		t.Fatalf("machine from snapshot: %q", got)
	}
}

// TestMachineThatStopsBeatingLeavesAnswers: DNS answers as the gateway
// routes. A machine whose heartbeats stop leaves a service's answers
// while the service has instances elsewhere, stays in the answers of a
// service that has none (fail open), and comes back when it beats again,
// with no routing event.
func TestMachineThatStopsBeatingLeavesAnswers(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	p, err := projection.New(projection.Config{Store: srv.Store})
	if err != nil {
		t.Fatal(err)
	}
	runProjection(t, p)
	_, addr := startServer(t, Config{}, ProjectionSource(p))
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{
			{ID: "web-a", Machine: "m1", Address: "10.100.0.5", Port: 8080},
			{ID: "web-b", Machine: "m2", Address: "10.100.0.6", Port: 8080},
		}},
		"solo": {Instances: []storetest.Instance{{ID: "solo-a", Machine: "m2", Address: "10.100.0.6", Port: 8081}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 200 * time.Millisecond
	beating := map[string]bool{"m1": true, "m2": true}
	var mu sync.Mutex
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
	// The control server's aggregator judges the beats.
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
	both := []string{"web.shop.edgeplane.internal. 5 IN A 10.100.0.5", "web.shop.edgeplane.internal. 5 IN A 10.100.0.6"}
	answersNow := func(name string, want []string) func() bool {
		return func() bool {
			_, got := answers(t, "udp", addr, name, dns.TypeA)
			return slices.Equal(got, want)
		}
	}
	storetest.Eventually(t, 10*time.Second, "both of web's instances answered", answersNow(web, both))

	mu.Lock()
	beating["m2"] = false
	mu.Unlock()
	storetest.Eventually(t, 10*time.Second, "m2's instance of web to leave the answers",
		answersNow(web, []string{"web.shop.edgeplane.internal. 5 IN A 10.100.0.5"}))
	if _, got := answers(t, "udp", addr, solo, dns.TypeA); !slices.Equal(got, []string{"solo.shop.edgeplane.internal. 5 IN A 10.100.0.6"}) {
		t.Fatalf("solo, whose only instance is on m2, answered %q; want it served anyway", got)
	}
	if _, got := answers(t, "tcp", addr, web, dns.TypeSRV); !slices.Equal(got, []string{
		"web.shop.edgeplane.internal. 5 IN SRV 0 10 8080 web-a.web.shop.edgeplane.internal."}) {
		t.Fatalf("SRV with m2 down: %q", got)
	}

	mu.Lock()
	beating["m2"] = true
	mu.Unlock()
	storetest.Eventually(t, 10*time.Second, "m2's instance of web back in the answers", answersNow(web, both))
	if v := p.View(); v.Seq != seq {
		t.Fatalf("liveness moved the routing sequence to %d", v.Seq)
	}
}
