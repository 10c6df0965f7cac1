package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// beater writes machine's heartbeats every interval until stopped, as its
// agent does.
type beater struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func beat(t *testing.T, s *store.Store, machine string, interval time.Duration) *beater {
	ctx, cancel := context.WithCancel(context.Background())
	b := &beater{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if err := s.PutMachineBeat(ctx, machine, interval); err != nil && ctx.Err() == nil {
				t.Errorf("beat of %s: %v", machine, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(b.stop) })
	return b
}

func (b *beater) stop() { b.cancel(); <-b.done }

// judge runs the control server's aggregator on s until the test ends:
// the judge of machine liveness the projection follows.
func judge(t *testing.T, s *store.Store) {
	t.Helper()
	a, err := fleet.New(s, fleet.Config{FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func liveIDs(v *projection.View, ns, name string) (string, bool) {
	svc, ok := v.Service(ns, name)
	if !ok {
		return "", false
	}
	eps, failOpen := v.LiveEndpoints(svc)
	return endpointIDs(&projection.Service{Endpoints: eps}), failOpen
}

// onM1AndM2 is a service with instance a1 on machine m1 and b1 on m2.
func onM1AndM2() storetest.Service {
	return storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
		Instances: []storetest.Instance{
			{ID: "a1", Machine: "m1", Address: "127.0.0.1", Port: 9001},
			{ID: "b1", Machine: "m2", Address: "127.0.0.2", Port: 9001},
		}}
}

// A machine whose heartbeats stop is judged down within three of its beat
// intervals: its instances are set aside while the service has others, and
// served anyway when it has none (fail open). It beats again: it is served
// again, with no routing event. The routing state is never touched.
func TestMachineThatStopsBeatingIsSetAside(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	two := onM1AndM2()
	only := storetest.Service{Routes: []store.Route{{Hosts: []string{"solo.example.com"}}},
		Instances: []storetest.Instance{{ID: "b2", Machine: "m2", Address: "127.0.0.2", Port: 9002}}}
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": two, "solo": only})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 200 * time.Millisecond
	beat(t, srv.Store, "m1", interval)
	m2 := beat(t, srv.Store, "m2", interval)
	judge(t, srv.Store)

	p := start(t, projection.Config{Connect: connectTo(t, srv.URL), Name: "gw-1"})
	waitSeq(t, p.Projection, seq)
	if ids, _ := liveIDs(p.View(), "shop", "web"); ids != "a1,b1" {
		t.Fatalf("both machines beat, live endpoints %q", ids)
	}

	m2.stop()
	stopped := time.Now()
	storetest.Eventually(t, wait, "m2 judged down", func() bool {
		_, down := p.View().Down("m2")
		return down
	})
	t.Logf("m2 judged down %s after its beats stopped (interval %s)", time.Since(stopped).Round(time.Millisecond), interval)
	v := p.View()
	if d, _ := v.Down("m2"); d.Liveness != store.MachineStale || d.Interval != interval {
		t.Errorf("m2 judged %+v", d)
	}
	if _, down := v.Down("m1"); down {
		t.Error("m1, which beats, is judged down")
	}
	if ids, failOpen := liveIDs(v, "shop", "web"); ids != "a1" || failOpen {
		t.Errorf("web's live endpoints with m2 down: %q (fail open %v), want a1", ids, failOpen)
	}
	if ids, failOpen := liveIDs(v, "shop", "solo"); ids != "b2" || !failOpen {
		t.Errorf("solo, all on m2: %q (fail open %v), want b2 served anyway", ids, failOpen)
	}
	if svc, _ := v.Service("shop", "web"); endpointIDs(svc) != "a1,b1" {
		t.Errorf("the routing state changed: %q", endpointIDs(svc))
	}
	if st := p.Status(); st.MachinesDown["m2"].Liveness != store.MachineStale {
		t.Errorf("status machines_down = %+v", st.MachinesDown)
	}

	beat(t, srv.Store, "m2", interval)
	storetest.Eventually(t, wait, "m2 served again", func() bool {
		ids, _ := liveIDs(p.View(), "shop", "web")
		return ids == "a1,b1"
	})
	if p.View().Seq != seq {
		t.Errorf("liveness moved the routing sequence: %d, want %d", p.View().Seq, seq)
	}
}

// A gateway that starts while a machine is already silent, and a judge
// that starts then too, judge it from the stored time of its last beat; a
// machine that never beat (an agent older than heartbeats) is not judged at
// all.
func TestSilentMachineAtLoadIsSetAside(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	svc := storetest.Service{Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
		Instances: []storetest.Instance{
			{ID: "a1", Machine: "m1", Address: "127.0.0.1", Port: 9001},
			{ID: "b1", Machine: "m2", Address: "127.0.0.2", Port: 9001},
			{ID: "c1", Machine: "m3", Address: "127.0.0.3", Port: 9001},
		}}
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": svc})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 100 * time.Millisecond
	beat(t, srv.Store, "m1", interval)
	if err := srv.Store.PutMachineBeat(ctx, "m2", interval); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * interval) // m2's one beat grows old before the gateway starts
	judge(t, srv.Store)
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL), Name: "gw-1"})
	waitSeq(t, p.Projection, seq)
	storetest.Eventually(t, wait, "m2 judged down", func() bool {
		_, down := p.View().Down("m2")
		return down
	})
	if ids, _ := liveIDs(p.View(), "shop", "web"); ids != "a1,c1" {
		t.Errorf("live endpoints %q, want a1 and c1 (m3 never beat: not judged)", ids)
	}
}

// A judgement older than store.LivenessExpiry is no judgement: with the
// judge away, a gateway sets no machine aside on its word.
func TestExpiredJudgementSetsNothingAside(t *testing.T) {
	srv := storetest.Start(t)
	ctx := ctxT(t)
	_, seq, err := storetest.Deploy(ctx, srv.Store, "shop", map[string]storetest.Service{"web": onM1AndM2()})
	if err != nil {
		t.Fatal(err)
	}
	downM2 := map[string]store.MachineDown{"m2": {Liveness: store.MachineOffline, LastBeat: time.Now().Add(-time.Minute), Interval: time.Second}}
	if err := srv.Store.PutLiveness(ctx, &store.LivenessRecord{At: time.Now().Add(-store.LivenessExpiry - time.Second), Down: downM2}); err != nil {
		t.Fatal(err)
	}
	p := start(t, projection.Config{Connect: connectTo(t, srv.URL), Name: "gw-1"})
	waitSeq(t, p.Projection, seq)
	if ids, _ := liveIDs(p.View(), "shop", "web"); ids != "a1,b1" {
		t.Fatalf("an expired judgement set aside %q's complement", ids)
	}
	fresh := time.Now()
	if err := srv.Store.PutLiveness(ctx, &store.LivenessRecord{At: fresh, Down: downM2}); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, wait, "m2 set aside by a fresh judgement", func() bool {
		ids, _ := liveIDs(p.View(), "shop", "web")
		return ids == "a1"
	})
	if err := srv.Store.PutLiveness(ctx, &store.LivenessRecord{At: fresh.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, wait, "m2 served again", func() bool {
		ids, _ := liveIDs(p.View(), "shop", "web")
		return ids == "a1,b1"
	})
}

// A judgement older than the one held (a reread racing a republished one)
// is ignored.
func TestOlderJudgementIsIgnored(t *testing.T) {
	srv := storetest.Start(t)
	p, err := projection.New(projection.Config{Store: srv.Store})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	down := map[string]store.MachineDown{"m2": {Liveness: store.MachineStale}}
	projection.NoteLiveness(p, &store.LivenessRecord{At: now, Down: down})
	projection.NoteLiveness(p, &store.LivenessRecord{At: now.Add(-time.Second)})
	if _, ok := p.View().Down("m2"); !ok {
		t.Fatal("an older judgement put m2 back")
	}
	projection.NoteLiveness(p, &store.LivenessRecord{At: now.Add(time.Second)})
	if _, ok := p.View().Down("m2"); ok {
		t.Fatal("a newer judgement did not put m2 back")
	}
}
