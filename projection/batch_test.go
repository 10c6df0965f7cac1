package projection_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// batchOf returns upserts of services s0..s<n-1> of ns from deploy, each
// about 1.5 KB (many hosts), so a few hundred take several parts.
func batchOf(ns, deploy string, n int) []store.RoutingEvent {
	evs := make([]store.RoutingEvent, n)
	for i := range evs {
		svc := fmt.Sprintf("s%d", i)
		var hosts []string
		for h := range 40 {
			hosts = append(hosts, fmt.Sprintf("h%d.%s.%s.test", h, svc, ns))
		}
		evs[i] = store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: ns, Service: svc, DeployID: deploy,
			Routes:    []store.Route{{Hosts: hosts}},
			Endpoints: []store.Endpoint{{InstanceID: svc + "-" + deploy, Machine: "m1", Address: "127.0.0.1", Port: 9000}}}
	}
	return evs
}

// A routing batch of several parts is applied in one view swap: no view a
// gateway serves holds part of it. Every service of it is served, and a
// rebuild from the store reads the same.
func TestRoutingBatchIsOneSwap(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	var seqs []uint64
	r := start(t, projection.Config{Connect: connectTo(t, srv.URL)}, func(p *projection.Projection) {
		projection.OnInstall(p, func(v *projection.View) {
			mu.Lock()
			seqs = append(seqs, v.Seq)
			mu.Unlock()
		})
	})
	p := r.Projection
	storetest.Eventually(t, wait, "initial load", func() bool { return r.Status().Loads == 1 })
	if _, err := storetest.AdmitMachine(ctx, srv.Store, "m1", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	for _, deploy := range []string{"d1", "d2"} {
		evs := batchOf("shop", deploy, 600)
		last, err := srv.Store.PublishRoutingBatch(ctx, deploy, "shop", evs)
		if err != nil {
			t.Fatal(err)
		}
		first := evs[0].Seq
		if first == last {
			t.Fatalf("a batch of 600 services of 1.5 KB in one part")
		}
		waitSeq(t, p, last)
		mu.Lock()
		for _, s := range seqs {
			if s >= first && s < last {
				t.Errorf("%s: a view at %d holds part of the batch at %d..%d (views %v)", deploy, s, first, last, seqs)
			}
		}
		mu.Unlock()
		for _, ev := range evs {
			if s, ok := p.View().Service("shop", ev.Service); !ok || s.DeployID != deploy {
				t.Fatalf("%s: shop/%s served as %+v", deploy, ev.Service, s)
			}
		}
		if st := r.Status(); st.Signatures.Refused != 0 || st.BadEvents != 0 || st.Dropped != 0 {
			t.Fatalf("%s: refused %d, bad %d, dropped %d", deploy, st.Signatures.Refused, st.BadEvents, st.Dropped)
		}
	}
	if _, ok := p.View().Lookup("h7.s599.shop.test", "/"); !ok {
		t.Fatal("the batch's last service is not served")
	}
}

// A gateway that falls behind a burst bigger than the 4096 messages its
// subscription's channel used to hold reads ahead instead of dropping
// them: its session stalls (a swap held) while 6,000 events are
// published, and once it goes on, NATS dropped none and every event is
// applied.
func TestBurstIsReadAheadNotDropped(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL)})
	storetest.Eventually(t, wait, "initial load", func() bool { return p.Status().Loads == 1 })
	if _, err := storetest.AdmitMachine(ctx, srv.Store, "m1", "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, wait, "the machine's event applied", func() bool { _, ok := p.View().Machine("m1"); return ok })
	applied := p.Status().EventsApplied
	evs := make([]store.RoutingEvent, 6000)
	for i := range evs {
		svc := "s" + itoa(i)
		evs[i] = store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "burst", Service: svc,
			Routes:    []store.Route{{Hosts: []string{svc + ".burst.test"}}},
			Endpoints: []store.Endpoint{{InstanceID: "i" + itoa(i), Machine: "m1", Address: "127.0.0.1", Port: 9000}}}
	}
	release := projection.HoldSwaps(p.Projection)
	seq, err := srv.Store.PublishRouting(ctx, "burst", evs)
	if err != nil {
		release()
		t.Fatal(err)
	}
	release()
	waitSeq(t, p.Projection, seq)
	st := p.Status()
	if st.Dropped != 0 || st.EventsApplied-applied != uint64(len(evs)) || st.BadEvents != 0 || st.Signatures.Refused != 0 {
		t.Fatalf("dropped %d, applied %d of %d, bad %d, refused %d", st.Dropped, st.EventsApplied-applied, len(evs), st.BadEvents, st.Signatures.Refused)
	}
	if _, ok := p.View().Lookup("s5999.burst.test", "/"); !ok {
		t.Fatal("the burst's last event's route is not served")
	}
}
