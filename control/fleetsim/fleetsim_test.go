package fleetsim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// startFleet starts a store, the control plane's routing republish
// service, and a simulated fleet of n machines, all ended with the test.
func startFleet(tb testing.TB, n int) (*storetest.Server, *fleetsim.Fleet) {
	tb.Helper()
	srv := storetest.Start(tb)
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	stopRepublish, err := routing.ServeRepublish(ctx, srv.Store)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stopRepublish)
	f, err := fleetsim.Start(ctx, srv.Connect(tb), fleetsim.Config{Machines: n})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.Stop)
	return srv, f
}

// A small simulated fleet takes a real apply: every replica placed, started
// and ready, the routing published; machine ls sees them all fresh.
func TestSimulatedFleetTakesAnApply(t *testing.T) {
	ctx := context.Background()
	srv, f := startFleet(t, 20)
	replicas := 40
	m := &store.Manifest{Namespace: "sim", Services: map[string]store.ServiceSpec{"web": {
		Command: []string{"/simulated"}, Replicas: &replicas, Routes: []store.Route{{Hosts: []string{"sim.example.com"}}}}}}
	d := deploy.New(srv.Store, deploy.Options{DrainGrace: time.Millisecond, GatewayWait: time.Millisecond})
	st, err := d.Apply(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != store.DeployCommitted || !st.Settled || f.Instances() != 40 {
		t.Fatalf("status %+v, %d simulated instances", st, f.Instances())
	}
	list, err := machines.List(ctx, srv.Store, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, l := range list {
		if l.Liveness != store.MachineFresh {
			t.Fatalf("%s is %s", l.ID, l.Liveness)
		}
		if l.Instances > 0 {
			used++
		}
	}
	if len(list) != 20 || used != 20 {
		t.Fatalf("%d machines listed, %d used: placement should spread 40 replicas over all 20", len(list), used)
	}
}

// BenchmarkApplyFleet is an apply of one service with one replica per
// machine on a simulated fleet (instances are ready at once, so the
// whole apply is control-plane time). Issue goal: 1,000 replicas on 1,000
// machines within 2 s of overhead.
func BenchmarkApplyFleet(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			ctx := context.Background()
			srv, _ := startFleet(b, n)
			replicas := n
			manifest := func(v int) *store.Manifest {
				return &store.Manifest{Namespace: "sim", Services: map[string]store.ServiceSpec{"web": {
					Command: []string{"/simulated"}, Replicas: &replicas, Env: map[string]string{"V": fmt.Sprint(v)},
					Routes: []store.Route{{Hosts: []string{"sim.example.com"}}}}}}
			}
			steps := map[deploy.Step]time.Duration{}
			d := deploy.New(srv.Store, deploy.Options{DrainGrace: time.Millisecond, GatewayWait: time.Millisecond,
				OnStep: func(s deploy.Step, took time.Duration) { steps[s] += took }})
			if _, err := d.Apply(ctx, manifest(-1)); err != nil {
				b.Fatal(err)
			}
			clear(steps)
			b.ResetTimer()
			for i := range b.N {
				if _, err := d.Apply(ctx, manifest(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			per := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 / float64(b.N) }
			for _, s := range []deploy.Step{deploy.StepProbe, deploy.StepStartCandidates, deploy.StepFinalCommit, deploy.StepPublishRouting, deploy.StepDrainOld} {
				b.ReportMetric(per(steps[s]), s.Name()+"-ms/op")
			}
		})
	}
}
