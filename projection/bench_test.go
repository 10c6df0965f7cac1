package projection_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// populate writes nsCount namespaces of svcPerNS services with instPerSvc
// ready instances each, as committed deploys whose routing the control
// plane signed and published (a routing batch per namespace), straight
// into the store (instance
// records through async KV publishes, which is what makes 100k records
// quick to write).
func populate(b *testing.B, s *store.Store, nsCount, svcPerNS, instPerSvc int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	// Endpoints are reached at their machines' admitted addresses.
	machines := map[string]*store.MachineRecord{}
	var upserts []store.RoutingEvent
	for k := range 500 {
		m := &store.MachineRecord{Version: 1, ID: fmt.Sprintf("m%03d", k), State: store.MachineActive,
			Address: fmt.Sprintf("10.100.%d.%d", k/250, k%250+1), JoinedAt: now, UpdatedAt: now}
		machines[m.ID] = m
		upserts = append(upserts, store.RoutingEvent{Kind: store.EventMachineUpsert, Machine: m, At: now})
	}
	if _, err := s.PublishRouting(ctx, "", upserts); err != nil {
		b.Fatal(err)
	}
	for n := 0; n < nsCount; n++ {
		ns := fmt.Sprintf("ns%04d", n)
		c := &store.DeployCommit{ID: ns + "-r1", Namespace: ns, Kind: store.CommitFinal, Revision: 1, CreatedAt: now,
			Manifest: store.Manifest{Namespace: ns, Services: map[string]store.ServiceSpec{}}}
		insts := map[string]*store.InstanceRecord{}
		for sv := 0; sv < svcPerNS; sv++ {
			name := fmt.Sprintf("svc%02d", sv)
			r := instPerSvc
			c.Manifest.Services[name] = store.ServiceSpec{Command: []string{"app"}, Replicas: &r,
				Routes: []store.Route{{Hosts: []string{fmt.Sprintf("%s.%s.example.com", name, ns), fmt.Sprintf("*.%s.%s.example.com", name, ns)}}}}
			for i := 0; i < instPerSvc; i++ {
				id := fmt.Sprintf("%s-%s-%d", ns, name, i)
				m := fmt.Sprintf("m%03d", (n*svcPerNS+sv+i)%500)
				c.Slots = append(c.Slots, store.SlotAssignment{Service: name, Slot: i, InstanceID: id, Machine: m, Revision: 1})
				rec := &store.InstanceRecord{Version: 1, ID: id, Namespace: ns, Service: name, Slot: i, Revision: 1,
					DeployID: c.ID, Machine: m, Address: fmt.Sprintf("10.100.%d.%d", i, sv+1), Port: 8000 + i,
					State: store.InstanceReady, Driver: "test", CreatedAt: now, UpdatedAt: now}
				insts[id] = rec
				data, _ := json.Marshal(rec)
				if _, err := s.JS.PublishAsync("$KV."+s.Names.InstancesBucket()+"."+rec.Key(), data); err != nil {
					b.Fatal(err)
				}
			}
		}
		// The routing publish shares the async window with the
		// instance records: let them land first (a loaded box
		// otherwise stalls it: "too many outstanding").
		select {
		case <-s.JS.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("async publishes did not complete")
		}
		if _, err := s.AppendCommit(ctx, c); err != nil {
			b.Fatal(err)
		}
		if _, err := s.PublishRoutingBatch(ctx, c.ID, ns, storetest.Events(c, nil, insts, machines)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-s.JS.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("async publishes did not complete")
	}
}

func heapMB() (inuse, total float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20), float64(ms.TotalAlloc) / (1 << 20)
}

// BenchmarkColdStart100k measures a gateway's first load from the store:
// 100k routable instances in 10k services (1000 namespaces), from Run to
// the first complete view, and the heap the view retains.
func BenchmarkColdStart100k(b *testing.B) {
	srv := storetest.Start(b)
	populate(b, srv.Store, 1000, 10, 10)
	st := srv.Connect(b)
	b.ResetTimer()
	var retained, allocated float64
	for i := 0; i < b.N; i++ {
		before, totalBefore := heapMB()
		start := time.Now()
		p := start1(b, projection.Config{Store: st})
		for p.Status().Loads == 0 {
			time.Sleep(time.Millisecond)
		}
		took := time.Since(start)
		after, totalAfter := heapMB()
		if n := p.Status().Routable; n != 100_000 {
			b.Fatalf("routable = %d, want 100000", n)
		}
		retained, allocated = after-before, totalAfter-totalBefore
		b.ReportMetric(took.Seconds(), "s/load")
		p.stop()
	}
	b.ReportMetric(retained, "MB-retained")
	b.ReportMetric(allocated, "MB-allocated")
}

// BenchmarkColdStartSnapshot100k measures starting from the local snapshot
// (NATS unreachable) with the same 100k instances.
func BenchmarkColdStartSnapshot100k(b *testing.B) {
	srv := storetest.Start(b)
	populate(b, srv.Store, 1000, 10, 10)
	snap := filepath.Join(b.TempDir(), "routing.json")
	p := start1(b, projection.Config{Store: srv.Store, SnapshotPath: snap})
	for p.Status().Loads == 0 {
		time.Sleep(time.Millisecond)
	}
	p.stop() // writes the final snapshot
	b.ResetTimer()
	var retained float64
	for i := 0; i < b.N; i++ {
		before, _ := heapMB()
		start := time.Now()
		q, err := projection.New(projection.Config{SnapshotPath: snap, Connect: func(context.Context) (*store.Store, error) {
			return nil, fmt.Errorf("unreachable")
		}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/load")
		after, _ := heapMB()
		if _, n, _ := q.View().Counts(); n != 100_000 {
			b.Fatalf("routable = %d", n)
		}
		retained = after - before
		runtime.KeepAlive(q)
	}
	b.ReportMetric(retained, "MB-retained")
}

func start1(b *testing.B, cfg projection.Config) *running {
	b.Helper()
	return start(b, cfg)
}

// BenchmarkEventApply measures routing events applied per second end to
// end: published to the stream (signed beforehand), received, verified, and
// swapped into the view, with 1000 services in the view. Sub-benchmarks:
// "sealed" publishes them as the control plane does (a routing batch of
// the namespace's 1000 services per commit, under one seal, each part
// checked by its digest), "signed" the same batches without seals (each
// part's own signature verified), "unsigned" the baseline that checks
// nothing, which the cost of verification is a ratio to, and "events" one
// message per event under a seal per SealMax (the fallback while an older
// gateway is live). No mode may drop an event (slow consumer).
func BenchmarkEventApply(b *testing.B) {
	eachMode(b, func(b *testing.B, mode benchMode) {
		srv := storetest.Start(b)
		benchMachines(b, srv)
		var opts []func(*projection.Projection)
		if mode == unsigned {
			opts = append(opts, projection.Unverified)
		}
		p := start(b, projection.Config{Store: srv.Connect(b)}, opts...)
		for p.Status().Loads == 0 {
			time.Sleep(time.Millisecond)
		}
		info, err := storetest.Stream(b, srv.Store, srv.Store.Names.RoutingEventsStream()).Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		base := info.State.LastSeq
		// Signed for the sequence each gets, as the control plane
		// does, before the clock starts: what is timed is the
		// gateway's side.
		msgs := benchEvents(b, srv, base, b.N, mode)
		b.ResetTimer()
		start, cpu := time.Now(), processCPU()
		publishInOrder(b, srv, base, msgs)
		last := base + uint64(len(msgs))
		for p.View().Seq < last {
			time.Sleep(100 * time.Microsecond)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		// The whole process's CPU (publisher, storage node, projection)
		// per event: what a loaded box changes least.
		b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/event")
		if st := p.Status(); st.Signatures.Refused != 0 || st.BadEvents != 0 || st.Dropped != 0 {
			b.Fatalf("%d refused, %d bad, %d dropped (slow consumer)", st.Signatures.Refused, st.BadEvents, st.Dropped)
		}
	})
}

// benchMode is how the events of a benchmark are signed and checked.
type benchMode int

const (
	// sealed: routing batches of the namespace's 1000 services under a
	// seal each, as the control plane publishes a commit's routing.
	sealed   benchMode = iota
	signed             // the same batches, each part checked by its own signature
	unsigned           // the same batches, checked by nobody: the baseline
	// events: one message per service, a seal per SealMax, as the
	// control plane publishes while a gateway before batches is live
	// (and as every mode did before batches).
	events
)

// eachMode runs bench as the sub-benchmarks "sealed", "signed",
// "unsigned" and "events".
func eachMode(b *testing.B, bench func(b *testing.B, mode benchMode)) {
	b.Run("sealed", func(b *testing.B) { bench(b, sealed) })
	b.Run("signed", func(b *testing.B) { bench(b, signed) })
	b.Run("unsigned", func(b *testing.B) { bench(b, unsigned) })
	b.Run("events", func(b *testing.B) { bench(b, events) })
}

// loadedProjection is a projection loaded from a fresh store, not
// following it (unverified unless verify), and what catches it up.
func loadedProjection(b *testing.B, verify bool) (*storetest.Server, *store.Store, *projection.Projection, func() error) {
	b.Helper()
	srv := storetest.Start(b)
	benchMachines(b, srv)
	st := srv.Connect(b)
	p, err := projection.New(projection.Config{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	if !verify {
		projection.Unverified(p)
	}
	catchUp, err := projection.Loaded(context.Background(), p, st)
	if err != nil {
		b.Fatal(err)
	}
	return srv, st, p, catchUp
}

// allApplied fails b unless p applied n events, none refused or bad.
func allApplied(b *testing.B, p *projection.Projection, n int) {
	b.Helper()
	if st := p.Status(); st.Signatures.Refused != 0 || st.BadEvents != 0 || st.EventsApplied != uint64(n) {
		b.Fatalf("%d applied, %d refused, %d bad", st.EventsApplied, st.Signatures.Refused, st.BadEvents)
	}
}

// benchMachines admits the machines benchEvents' endpoints run on.
func benchMachines(b *testing.B, srv *storetest.Server) {
	b.Helper()
	for id, addr := range map[string]string{"m1": "10.100.0.1", "m2": "10.100.0.2"} {
		if _, err := storetest.AdmitMachine(context.Background(), srv.Store, id, addr); err != nil {
			b.Fatal(err)
		}
	}
}

// benchEvents returns the messages that append n routing events for 1000
// services of namespace "bench" after sequence base, each signed, as the
// control plane signs, for the sequence it gets there: every 1000 events
// one routing batch (sealed unless mode says otherwise), or with mode
// events one message per event, sealed in batches as PublishRouting files
// them.
func benchEvents(b *testing.B, srv *storetest.Server, base uint64, n int, mode benchMode) []*nats.Msg {
	b.Helper()
	key, err := signing.ReadKeyFile(srv.SignerFile())
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]store.RoutingEvent, n)
	for i := range evs {
		svc := fmt.Sprintf("s%d", i%1000)
		evs[i] = store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "bench", Service: svc,
			Routes:    []store.Route{{Hosts: []string{svc + ".bench.test"}}},
			Endpoints: []store.Endpoint{{InstanceID: "i1", Machine: "m1", Address: "10.100.0.1", Port: 8000}, {InstanceID: "i2", Machine: "m2", Address: "10.100.0.2", Port: 8000}}}
	}
	if mode == events {
		msgs, err := srv.Store.SignRouting(key, base, evs)
		if err != nil {
			b.Fatal(err)
		}
		return msgs
	}
	var out []*nats.Msg
	for len(evs) > 0 {
		k := min(len(evs), 1000)
		msgs, err := srv.Store.SignRoutingBatch(key, base+uint64(len(out)), "bench", evs[:k])
		if err != nil {
			b.Fatal(err)
		}
		if mode != sealed && len(msgs) > 1 {
			// No seal: each part signed for the place it gets.
			msgs = msgs[1:]
			for i, m := range msgs {
				seq := base + uint64(len(out)+i) + 1
				m.Header.Set(signing.Header, key.Sign(signing.Message{Subject: m.Subject, Seq: seq, Body: m.Data}))
			}
		}
		out = append(out, msgs...)
		evs = evs[k:]
	}
	return out
}

// publishInOrder publishes msgs on one connection, each expecting the last
// sequence before it, and waits for every acknowledgement.
func publishInOrder(b *testing.B, srv *storetest.Server, base uint64, msgs []*nats.Msg) {
	b.Helper()
	acks := make([]jetstream.PubAckFuture, 0, len(msgs))
	for i, m := range msgs {
		f, err := srv.Store.JS.PublishMsgAsync(m, jetstream.WithExpectLastSequence(base+uint64(i)))
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// A loaded box answers slower than this publishes: let the
			// window drain, then go on.
			<-srv.Store.JS.PublishAsyncComplete()
			f, err = srv.Store.JS.PublishMsgAsync(m, jetstream.WithExpectLastSequence(base+uint64(i)))
		}
		if err != nil {
			b.Fatal(err)
		}
		acks = append(acks, f)
	}
	<-srv.Store.JS.PublishAsyncComplete()
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
}

// BenchmarkEventCatchUp measures the gateway's side alone: routing events
// already stored (signed beforehand), read with direct gets from the
// applied sequence, verified and swapped into the view, 4000 at a time, as
// a gateway does when it is behind the stream. The unsigned sub-benchmark
// applies the same events without checking signatures.
func BenchmarkEventCatchUp(b *testing.B) {
	eachMode(b, func(b *testing.B, mode benchMode) {
		srv, _, p, catchUp := loadedProjection(b, mode != unsigned)
		seq := p.View().Seq
		b.ResetTimer()
		var took time.Duration
		// The stream keeps the last 4 messages of each subject: publish
		// 4000 events at a time (not timed), then catch up.
		for done := 0; done < b.N; {
			n := min(4000, b.N-done)
			b.StopTimer()
			msgs := benchEvents(b, srv, seq, n, mode)
			publishInOrder(b, srv, seq, msgs)
			b.StartTimer()
			start := time.Now()
			if err := catchUp(); err != nil {
				b.Fatal(err)
			}
			took += time.Since(start)
			done += n
			seq += uint64(len(msgs))
			if got := p.View().Seq; got != seq {
				b.Fatalf("applied %d, want %d", got, seq)
			}
		}
		b.ReportMetric(float64(b.N)/took.Seconds(), "events/s")
		allApplied(b, p, b.N)
	})
}

// BenchmarkEventVerifyApply measures the projection's own work per routing
// event, without NATS: events as read from the stream (signed for their
// sequences), verified, decoded and applied in the batches a catch-up
// applies, with 1000 services in the view.
func BenchmarkEventVerifyApply(b *testing.B) {
	eachMode(b, func(b *testing.B, mode benchMode) {
		srv, st, p, _ := loadedProjection(b, mode != unsigned)
		if _, err := st.LoadSigners(context.Background()); err != nil {
			b.Fatal(err)
		}
		first := p.View().Seq
		msgs := benchEvents(b, srv, first, b.N, mode)
		stored := make([]*store.StoredMsg, len(msgs))
		now := time.Now()
		for i, m := range msgs {
			stored[i] = &store.StoredMsg{Subject: m.Subject, Seq: first + uint64(i) + 1, Time: now, Header: m.Header, Data: m.Data}
		}
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		if err := projection.ApplyStored(context.Background(), p, st, stored); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		allApplied(b, p, b.N)
	})
}

// BenchmarkLookup measures View.Lookup in a view of 10k services, parallel,
// half exact hosts and half wildcard hosts.
func BenchmarkLookup(b *testing.B) {
	v := benchView(b, 10_000)
	hosts := make([]string, 1024)
	for i := range hosts {
		if i%2 == 0 {
			hosts[i] = fmt.Sprintf("svc%d.example.com", (i*7919)%10_000)
		} else {
			hosts[i] = fmt.Sprintf("tenant-%d.svc%d.example.com", i, (i*7919)%10_000)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := v.Lookup(hosts[i&1023], "/api/x"); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

func benchView(b *testing.B, n int) *projection.View {
	evs := make([]store.RoutingEvent, n)
	for i := range evs {
		evs[i] = store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "bench", Service: fmt.Sprintf("svc%d", i),
			Routes: []store.Route{
				{Hosts: []string{fmt.Sprintf("svc%d.example.com", i), fmt.Sprintf("*.svc%d.example.com", i)}},
				{Hosts: []string{fmt.Sprintf("svc%d.example.com", i)}, PathPrefixes: []string{"/api", "/static"}},
			},
			Endpoints: []store.Endpoint{{InstanceID: "a", Machine: "m1", Address: "10.100.0.1", Port: 8000}}}
	}
	evs = append(evs, store.RoutingEvent{Version: 1, Kind: store.EventMachineUpsert, Machine: &store.MachineRecord{ID: "m1", Address: "10.100.0.1"}})
	v, err := projection.BuildView(evs)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// BenchmarkDigest is what a gateway spends on its report after its view
// changed: the digest of what it serves, 100,000 services (200,000 hosts),
// each service's own hash already known (it is computed once per service,
// when first needed).
func BenchmarkDigest(b *testing.B) {
	evs := benchView(b, 100_000)
	evs.Digest()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		v := projection.Rebuilt(evs)
		if v.Digest() == "" {
			b.Fatal("no digest")
		}
	}
}

// processCPU is the CPU time this process used so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
