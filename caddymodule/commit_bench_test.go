package caddymodule

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
	"github.com/nats-io/nats.go"
)

// BenchmarkCommitToServed measures the time from appending a deploy's final
// commit (instances already ready, as after the phase work) to the first
// request through the gateway that the new revision's instance answers.
// Each iteration is one redeploy; p50/p99/max are over all iterations.
func BenchmarkCommitToServed(b *testing.B) {
	r := newRedeployer(b, newFixture(b))
	r.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	traces := r.run(ctx, b, b.N, 0)
	b.StopTimer()
	served := phase(traces, func(t commitTrace) time.Duration { return t.served })
	b.ReportMetric(ms(pct(served, 50)), "p50-ms")
	b.ReportMetric(ms(pct(served, 99)), "p99-ms")
	b.ReportMetric(ms(pct(served, 100)), "max-ms")
	b.Log("\n" + traceTable("", traces))
}

// BenchmarkCommitToServedTLS is CommitToServed against two storage nodes
// with credentials in one process, the gateway on gateway credentials: one
// plaintext (an auth dir without the fleet CA), one TLS. Rounds of
// commitBlock redeploys alternate between them (the gateway's config
// reloaded onto the other node between rounds, and a few redeploys
// discarded after it), so that drift in the machine's load falls on both
// alike; -benchtime=1000x is 1000 redeploys in each mode. Its ratios are
// what TLS on the wire costs the path from a final commit to a served
// request; the log says where each mode's time went, phase by phase, and
// what the slowest redeploys spent it on.
func BenchmarkCommitToServedTLS(b *testing.B) {
	modes := []struct {
		name string
		r    *redeployer
	}{
		{"plaintext", newRedeployer(b, newAuthFixture(b, storagenode.ToggleOff))},
		{"tls", newRedeployer(b, newAuthFixture(b, storagenode.ToggleOn))},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	traces := make([][]commitTrace, len(modes))
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; round++ {
		n := min(commitBlock, b.N-done)
		runMode := func(i int) func() {
			return func() {
				b.StopTimer()
				modes[i].r.serve()
				traces[i] = append(traces[i], modes[i].r.run(ctx, b, n, commitWarmup)...)
			}
		}
		alternate(round, runMode(0), runMode(1))
		done += n
	}
	b.StopTimer()
	var p50s, p99s [2]float64
	for i, m := range modes {
		served := phase(traces[i], func(t commitTrace) time.Duration { return t.served })
		p50s[i], p99s[i] = ms(pct(served, 50)), ms(pct(served, 99))
		b.ReportMetric(p50s[i], m.name+"-p50-ms")
		b.ReportMetric(p99s[i], m.name+"-p99-ms")
		b.Logf("%s:\n%s", m.name, traceTable(m.name, traces[i]))
	}
	b.ReportMetric(p50s[1]/p50s[0], "p50-ratio(tls/plain)")
	b.ReportMetric(p99s[1]/p99s[0], "p99-ratio(tls/plain)")
}

// commitBlock is how many redeploys a round of CommitToServedTLS runs in
// one mode before it turns to the other; commitWarmup how many it runs
// first and does not count (the gateway's projection is new after the
// reload, its first views and connections are not the steady state).
const (
	commitBlock  = 50
	commitWarmup = 3
)

// newAuthFixture is newFixture on a storage node that requires credentials,
// speaking TLS or not; the store signs with a signer certified under the
// node's trust root, and the gateway's credentials carry it (and the CA).
func newAuthFixture(b *testing.B, mode storagenode.Toggle) *fixture {
	b.Helper()
	n, dir := bootAuthNode(b, mode)
	authDir := filepath.Join(dir, "auth")
	if _, err := signers.Server(b.Context(), n.Store, authDir, dir, "bench"); err != nil {
		b.Fatal(err)
	}
	creds, err := n.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw-test"})
	if err != nil {
		b.Fatal(err)
	}
	f := newFixtureOn(b, &storetest.Server{NATS: n.Server, URL: n.Server.ClientURL(), Dir: dir, Store: n.Store})
	f.creds = filepath.Join(dir, "gateway.creds")
	if err := os.WriteFile(f.creds, creds, 0o600); err != nil {
		b.Fatal(err)
	}
	return f
}

// bootAuthNode boots a storage node that requires credentials, speaking
// TLS or not (an auth dir without the fleet CA), and returns it with its
// data dir (its auth dir is dir/auth).
func bootAuthNode(b *testing.B, mode storagenode.Toggle) (*storagenode.Node, string) {
	b.Helper()
	dir := b.TempDir()
	authDir := filepath.Join(dir, "auth")
	if _, err := storagenode.LoadAuth(authDir, true); err != nil {
		b.Fatal(err)
	}
	if mode == storagenode.ToggleOff {
		if err := os.RemoveAll(filepath.Join(authDir, "tls")); err != nil {
			b.Fatal(err)
		}
	}
	n, err := storagenode.Boot(b.Context(), storagenode.BootConfig{DataDir: dir, Listen: "127.0.0.1:0", Auth: storagenode.AuthOn,
		AuthDir: authDir, TLS: mode, Encrypt: storagenode.ToggleOff})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(n.Close)
	if (n.TLS != nil) != (mode == storagenode.ToggleOn) {
		b.Fatalf("the node's TLS is %v, want %s", n.TLS != nil, mode)
	}
	return n, dir
}

// redeployer redeploys one service of a fixture's store over and over,
// its one instance alternating between two backends, and times each
// final commit until the gateway serves the new instance.
type redeployer struct {
	f        *fixture
	backends [2]*backend
	// n counts the redeploys so far; seq is the routing stream's last
	// sequence after the latest.
	n   int
	seq uint64
}

// newRedeployer deploys the first revision (the gateway is not loaded yet).
func newRedeployer(b *testing.B, f *fixture) *redeployer {
	r := &redeployer{f: f, backends: [2]*backend{newBackend(b, "even"), newBackend(b, "odd")}}
	r.seq = f.deploy("bench", map[string]storetest.Service{"web": svc([]string{"bench.test"}, nil, r.backends[1])})
	return r
}

// serve (re)loads the gateway on r's store and waits until it serves the
// latest redeploy.
func (r *redeployer) serve() {
	r.f.load()
	r.f.waitSeq(r.seq)
}

// commitTrace is where one redeploy's time went, each figure from the
// moment its final commit was handed to the store (t0).
type commitTrace struct {
	// commitStored and routingStored are the stream timestamps (the
	// node's clock, this box's) of the commit and of the last routing
	// event: when the node stored them.
	commitStored, routingStored time.Duration
	// acked is when Commit returned: every append acknowledged.
	acked time.Duration
	// built is when the gateway's projection built the view that served
	// the new instance (View.BuiltAt).
	built time.Duration
	// served is when the first request the new instance answered came
	// back: the figure the benchmark reports.
	served time.Duration
	// gcs is how many garbage collections ended during the redeploy.
	gcs uint64
}

// run times n redeploys after warmup untimed ones; the timer runs only
// while a commit is on its way to being served.
func (r *redeployer) run(ctx context.Context, b *testing.B, n, warmup int) []commitTrace {
	traces := make([]commitTrace, 0, n)
	for i := 0; i < warmup+n; i++ {
		t := r.redeploy(ctx, b)
		if i >= warmup {
			traces = append(traces, t)
		}
	}
	return traces
}

// redeploy moves the service's one instance to the other backend (its
// records written untimed) and times the final commit until served.
func (r *redeployer) redeploy(ctx context.Context, b *testing.B) commitTrace {
	b.StopTimer()
	want := r.backends[r.n%2]
	inst := want.instance()
	inst.ID = fmt.Sprintf("%s-%d", want.name, r.n)
	r.n++
	st := r.f.nats.Store
	p, err := storetest.Prepare(ctx, st, "bench", map[string]storetest.Service{
		"web": {Routes: svc([]string{"bench.test"}, nil).Routes, Instances: []storetest.Instance{inst}}})
	if err != nil {
		b.Fatal(err)
	}
	prev := r.seq
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(gc)
	gcs := gc[0].Value.Uint64()
	b.StartTimer()
	t0 := time.Now()
	seq, err := p.Commit(ctx)
	if err != nil {
		b.Fatal(err)
	}
	t := commitTrace{acked: time.Since(t0)}
	for {
		got, err := r.f.get("bench.test", "/")
		if err != nil {
			b.Fatal(err)
		}
		if got.backend == want.name {
			break
		}
	}
	t.served = time.Since(t0)
	b.StopTimer()
	metrics.Read(gc)
	t.gcs = gc[0].Value.Uint64() - gcs
	r.seq = seq
	if v := r.f.proj().View(); v.Seq >= seq {
		t.built = v.BuiltAt.Sub(t0)
	}
	// The stream timestamps, read back once the redeploy is timed.
	stored := func(stream string, from uint64) (last time.Duration) {
		if _, err := st.ReadFrom(ctx, stream, from, "", func(m *store.StoredMsg) error {
			last = m.Time.Sub(t0)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		return last
	}
	t.commitStored = stored(st.Names.DeployCommitsStream(), p.Deploy.Seq)
	t.routingStored = stored(st.Names.RoutingEventsStream(), prev+1)
	b.StartTimer()
	return t
}

// phase is one figure of every trace, sorted.
func phase(traces []commitTrace, f func(commitTrace) time.Duration) []time.Duration {
	ds := make([]time.Duration, len(traces))
	for i, t := range traces {
		ds[i] = f(t)
	}
	return sorted(ds)
}

func sorted(ds []time.Duration) []time.Duration {
	slices.Sort(ds)
	return ds
}

// pct is the p-th percentile of sorted ds (100: the largest).
func pct(ds []time.Duration, p int) time.Duration {
	return ds[min(len(ds)*p/100, len(ds)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// traceTable says where the redeploys' time went: percentiles of each
// step (from the previous step's end, stream timestamps and the view's
// build time included), then the slowest redeploys step by step.
func traceTable(name string, traces []commitTrace) string {
	steps := []struct {
		name string
		of   func(commitTrace) time.Duration
	}{
		{"commit stored", func(t commitTrace) time.Duration { return t.commitStored }},
		{"routing stored", func(t commitTrace) time.Duration { return t.routingStored - t.commitStored }},
		{"acked", func(t commitTrace) time.Duration { return t.acked - t.routingStored }},
		{"view built", func(t commitTrace) time.Duration { return t.built - t.routingStored }},
		{"served", func(t commitTrace) time.Duration { return t.served - max(t.built, t.acked) }},
		{"total", func(t commitTrace) time.Duration { return t.served }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-16s %8s %8s %8s %8s %8s  (ms; acked and view built both from routing stored)\n", name, "p50", "p90", "p99", "max", "mean")
	for _, s := range steps {
		ds := phase(traces, s.of)
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		fmt.Fprintf(&sb, "%-16s %8.3f %8.3f %8.3f %8.3f %8.3f\n", s.name, ms(pct(ds, 50)), ms(pct(ds, 90)), ms(pct(ds, 99)), ms(pct(ds, 100)), ms(sum/time.Duration(len(ds))))
	}
	slow := slices.Clone(traces)
	slices.SortFunc(slow, func(a, b commitTrace) int { return int(b.served - a.served) })
	slow = slow[:min(len(slow), max(len(slow)/100, 5))]
	fmt.Fprintf(&sb, "slowest: commit stored / routing stored / acked / view built / served (ms from t0), GCs\n")
	for _, t := range slow {
		fmt.Fprintf(&sb, "  %7.3f %7.3f %7.3f %7.3f %7.3f  %d\n", ms(t.commitStored), ms(t.routingStored), ms(t.acked), ms(t.built), ms(t.served), t.gcs)
	}
	var gcs uint64
	for _, t := range traces {
		gcs += t.gcs
	}
	fmt.Fprintf(&sb, "GCs ending inside a redeploy: %d over %d redeploys", gcs, len(traces))
	return sb.String()
}

// BenchmarkStoreHopTLS is the wire under CommitToServedTLS, one hop at a
// time, on a plaintext and a TLS node in one process, in alternating
// rounds: a message of a routing event's size delivered from the node's
// own connection to another client (latency, the process's CPU and
// allocations per message, and the client's socket reads per message:
// above 1 when a message arrives in two TLS records read apart), and a
// request's round trip (the stream info every commit asks for first).
// Run with -benchtime=1x.
func BenchmarkStoreHopTLS(b *testing.B) {
	type hop struct {
		name string
		node *storagenode.Node
		nc   *nats.Conn
		conn *countingConn
	}
	var hops []*hop
	for _, mode := range []storagenode.Toggle{storagenode.ToggleOff, storagenode.ToggleOn} {
		node, _ := bootAuthNode(b, mode)
		creds, err := node.Auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleControl})
		if err != nil {
			b.Fatal(err)
		}
		file := filepath.Join(b.TempDir(), "hop.creds")
		if err := os.WriteFile(file, creds, 0o600); err != nil {
			b.Fatal(err)
		}
		h := &hop{name: map[storagenode.Toggle]string{storagenode.ToggleOff: "plaintext", storagenode.ToggleOn: "tls"}[mode], node: node}
		// The options store.Connect gives a client of this node, and a
		// dialer that counts the reads under TLS.
		opts := []nats.Option{nats.UserCredentials(file), nats.SetCustomDialer(dialerFunc(func(network, addr string) (net.Conn, error) {
			c, err := net.Dial(network, addr)
			if err != nil {
				return nil, err
			}
			h.conn = &countingConn{Conn: c}
			return h.conn, nil
		}))}
		if node.TLS != nil {
			opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: node.Auth.TLS.Pool()}), nats.TLSHandshakeFirst())
		}
		if h.nc, err = nats.Connect(node.Server.ClientURL(), opts...); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(h.nc.Close)
		hops = append(hops, h)
	}
	const rounds, perRound = 6, 2000
	payload := make([]byte, hopPayload)
	type figures struct {
		deliver, request    []time.Duration
		cpu                 time.Duration
		allocs, reads, msgs uint64
	}
	figs := make([]figures, len(hops))
	deliver := func(i int) {
		h, fig := hops[i], &figs[i]
		got := make(chan *nats.Msg, 1)
		sub, err := h.nc.ChanSubscribe("bench.hop", got)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := h.nc.Flush(); err != nil {
			b.Fatal(err)
		}
		own := h.node.Store.NC
		mallocs := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
		metrics.Read(mallocs)
		allocs0, reads0, cpu0 := mallocs[0].Value.Uint64(), h.conn.reads.Load(), processCPU(b)
		for range perRound {
			t0 := time.Now()
			if err := own.Publish("bench.hop", payload); err != nil {
				b.Fatal(err)
			}
			<-got
			fig.deliver = append(fig.deliver, time.Since(t0))
		}
		fig.cpu += processCPU(b) - cpu0
		metrics.Read(mallocs)
		fig.allocs += mallocs[0].Value.Uint64() - allocs0
		fig.reads += uint64(h.conn.reads.Load() - reads0)
		fig.msgs += perRound
		for range perRound / 4 {
			t0 := time.Now()
			if err := store.CheckQuorum(context.Background(), h.nc, h.node.Store.Names); err != nil {
				b.Fatal(err)
			}
			fig.request = append(fig.request, time.Since(t0))
		}
	}
	b.ResetTimer()
	for round := range rounds {
		alternate(round, func() { deliver(0) }, func() { deliver(1) })
	}
	b.StopTimer()
	for i, h := range hops {
		fig := figs[i]
		d, r := sorted(fig.deliver), sorted(fig.request)
		b.ReportMetric(float64(pct(d, 50).Microseconds()), h.name+"-deliver-p50-µs")
		b.ReportMetric(float64(pct(d, 99).Microseconds()), h.name+"-deliver-p99-µs")
		b.ReportMetric(float64(fig.cpu.Nanoseconds())/float64(fig.msgs)/1000, h.name+"-cpu-µs/msg")
		b.ReportMetric(float64(fig.allocs)/float64(fig.msgs), h.name+"-allocs/msg")
		b.ReportMetric(float64(fig.reads)/float64(fig.msgs), h.name+"-reads/msg")
		b.ReportMetric(float64(pct(r, 50).Microseconds()), h.name+"-request-p50-µs")
		b.ReportMetric(float64(pct(r, 99).Microseconds()), h.name+"-request-p99-µs")
	}
}

// hopPayload is about the size of a routing event of the CommitToServed
// redeploys as the node republishes it (one service, one instance: 314
// bytes under some 600 bytes of headers).
const hopPayload = 1000

// countingConn counts the reads of a client's socket.
type countingConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(b)
}

type dialerFunc func(network, addr string) (net.Conn, error)

func (d dialerFunc) Dial(network, addr string) (net.Conn, error) { return d(network, addr) }
