package projection_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkCommitToServed measures a commit that changes 100,000 instances
// (one namespace of 10,000 services of 10 instances, every one of them a
// new revision) from the call that publishes its routing to the moment the
// last of N gateway projections, each on its own connection to one storage
// node, all in this process, holds the new revision of every service.
// "batch" publishes as the control plane does (PublishRoutingBatch: a
// routing batch under one seal), "events" as it does while an older
// gateway is live (PublishRouting: a message per service, a seal per 500).
// Reported: the median over iterations of the time to the last projection
// (s-last), its max, the time to the first (s-first; a projection that got
// there before the publish call returned counts the return), and the
// publish call alone (s-publish), and the process's CPU time per commit
// (cpu-s) and per gateway (cpu-s/gateway).
//
// All N projections share this process's cores: with N=100 on a 2-core box
// the figure is bound by 100 projections' decoding and applying, which
// on a fleet each gateway does on its own box; N=1 is one gateway's share.
func BenchmarkCommitToServed(b *testing.B) {
	for _, gateways := range []int{1, 10, 100} {
		for _, mode := range []string{"batch", "events"} {
			b.Run(fmt.Sprintf("gateways=%d/%s", gateways, mode), func(b *testing.B) {
				commitToServed(b, gateways, mode == "batch")
			})
		}
	}
}

func commitToServed(b *testing.B, gateways int, batch bool) {
	const services, instances, machines = 10_000, 10, 100
	srv := storetest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	var ms []store.RoutingEvent
	for k := range machines {
		m := &store.MachineRecord{Version: 1, ID: fmt.Sprintf("m%03d", k), State: store.MachineActive,
			Address: fmt.Sprintf("10.100.%d.%d", k/250, k%250+1), JoinedAt: now, UpdatedAt: now}
		ms = append(ms, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: m, At: now})
	}
	if _, err := srv.Store.PublishRouting(ctx, "", ms); err != nil {
		b.Fatal(err)
	}
	commit := func(rev int64) []store.RoutingEvent {
		evs := make([]store.RoutingEvent, services)
		deploy := fmt.Sprintf("big-r%d", rev)
		for sv := range evs {
			name := fmt.Sprintf("svc%05d", sv)
			ev := store.RoutingEvent{Kind: store.EventServiceUpsert, Namespace: "big", Service: name, DeployID: deploy, Revision: rev, At: now,
				Routes: []store.Route{{Hosts: []string{name + ".big.example.com", "*." + name + ".big.example.com"}}}}
			for i := range instances {
				k := (sv + i) % machines
				ev.Endpoints = append(ev.Endpoints, store.Endpoint{InstanceID: fmt.Sprintf("%s-%d-r%d", name, i, rev), Machine: fmt.Sprintf("m%03d", k),
					Slot: i, Revision: rev, Address: fmt.Sprintf("10.100.%d.%d", k/250, k%250+1), Port: 8000 + i})
			}
			evs[sv] = ev
		}
		return evs
	}
	publish := func(rev int64, evs []store.RoutingEvent) uint64 {
		// An acknowledgement later than a write's attempt allows (the
		// storage node shares the cores with every projection) fails
		// the publish; the control plane's apply retries it with the same
		// message IDs, which land nothing twice, and so does this.
		for attempt := 1; ; attempt++ {
			var last uint64
			var err error
			if batch {
				last, err = srv.Store.PublishRoutingBatch(ctx, fmt.Sprintf("big-r%d", rev), "big", evs)
			} else {
				last, err = srv.Store.PublishRouting(ctx, fmt.Sprintf("big-r%d", rev), evs)
			}
			if err == nil {
				return last
			}
			if !store.HasCode(err, store.CodeUnavailable) || attempt == 10 {
				b.Fatal(err)
			}
			b.Logf("publish attempt %d: %v", attempt, err)
		}
	}
	first := publish(1, commit(1))
	ps := make([]*running, gateways)
	for i := range ps {
		ps[i] = start(b, projection.Config{Store: srv.Connect(b)})
	}
	for _, p := range ps {
		for p.View().Seq < first {
			time.Sleep(10 * time.Millisecond)
		}
	}
	var lastTimes, firstTimes, pubTimes, cpus []time.Duration
	b.ResetTimer()
	for i := range b.N {
		rev := int64(i + 2)
		evs := commit(rev)
		start, cpu := time.Now(), processCPU()
		last := publish(rev, evs)
		pub := time.Since(start)
		arrived := make([]time.Duration, len(ps))
		for left := len(ps); left > 0; {
			for j, p := range ps {
				if arrived[j] == 0 && p.View().Seq >= last {
					arrived[j] = time.Since(start)
					left--
				}
			}
			if ctx.Err() != nil {
				b.Fatal(ctx.Err())
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		cpus = append(cpus, processCPU()-cpu)
		lastTimes = append(lastTimes, slices.Max(arrived))
		firstTimes = append(firstTimes, slices.Min(arrived))
		pubTimes = append(pubTimes, pub)
		for j, p := range ps {
			v := p.View()
			for sv := range services {
				if s, ok := v.Service("big", fmt.Sprintf("svc%05d", sv)); !ok || s.Revision != rev || len(s.Endpoints) != instances {
					b.Fatalf("gateway %d: svc%05d served as %+v, want revision %d with %d endpoints", j, sv, s, rev, instances)
				}
			}
			if st := p.Status(); st.Dropped != 0 || st.BadEvents != 0 || st.Signatures.Refused != 0 {
				b.Fatalf("gateway %d: dropped %d, bad %d, refused %d", j, st.Dropped, st.BadEvents, st.Signatures.Refused)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2].Seconds()
	}
	b.ReportMetric(median(lastTimes), "s-last")
	b.ReportMetric(slices.Max(lastTimes).Seconds(), "s-last-max")
	b.ReportMetric(median(firstTimes), "s-first")
	b.ReportMetric(median(pubTimes), "s-publish")
	// The whole process's CPU (publisher, storage node, every
	// projection) per commit, and per gateway: what a gateway's box
	// spends, plus its share of the storage node's fan-out.
	b.ReportMetric(median(cpus), "cpu-s")
	b.ReportMetric(median(cpus)/float64(gateways), "cpu-s/gateway")
	b.ReportMetric(0, "ns/op")
}
