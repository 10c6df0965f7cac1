package fleetsim_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// storage is one storage node or a three-node cluster in this process,
// with credentials required, and the control plane's aggregator and
// routing republish service running on a control connection.
type storage struct {
	nodes  []*server.Server
	dialer *fleetsim.Dialer
	s      *store.Store
	agg    *fleet.Aggregator
}

func startStorage(tb testing.TB, nodes int) *storage {
	tb.Helper()
	dir := tb.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		tb.Fatal(err)
	}
	st := &storage{}
	var routes []string
	for range nodes {
		routes = append(routes, storetest.FreeAddr(tb))
	}
	var urls []string
	for i := range nodes {
		cfg := storagenode.Config{DataDir: filepath.Join(dir, fmt.Sprintf("s%d", i+1)), Listen: "127.0.0.1:0", Auth: auth,
			ServerName: fmt.Sprintf("s%d", i+1)}
		if nodes > 1 {
			cfg.Cluster = &storagenode.ClusterConfig{Name: "edge", Listen: routes[i], Routes: routes, Secret: auth.ClusterSecret}
		}
		ns, err := storagenode.Start(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		st.nodes = append(st.nodes, ns)
		urls = append(urls, ns.ClientURL())
	}
	names, _ := store.NewNames("", "")
	creds := filepath.Join(dir, "creds")
	if err := os.Mkdir(creds, 0o700); err != nil {
		tb.Fatal(err)
	}
	st.dialer = &fleetsim.Dialer{URLs: strings.Join(urls, ","), Auth: auth, Dir: creds, Names: names}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	// The control plane's own connection provisions the store.
	o := store.ConnectOptions{URL: st.dialer.URLs, Name: "control", ReconnectForever: true}
	b, err := auth.IssueCreds(storagenode.CredsRequest{Role: storagenode.RoleControl})
	if err != nil {
		tb.Fatal(err)
	}
	o.CredsFile = filepath.Join(creds, "control-provision.creds")
	if err := os.WriteFile(o.CredsFile, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	nc, err := store.Connect(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	defer pcancel()
	if err := store.WaitForJetStream(pctx, nc); err != nil {
		tb.Fatal(err)
	}
	replicas := 1
	if nodes > 1 {
		replicas = 3
	}
	// A new cluster elects its meta leader first.
	storetest.Eventually(tb, time.Minute, "provisioning the store", func() bool {
		st.s, err = store.Provision(pctx, nc, names, store.Layout{Replicas: replicas})
		return err == nil
	})
	if _, err := signers.Server(ctx, st.s, filepath.Join(dir, "auth"), dir, "fleetsim"); err != nil {
		tb.Fatal(err)
	}
	stopRepublish, err := routing.ServeRepublish(ctx, st.s)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stopRepublish)
	if st.agg, err = fleet.New(st.s, fleet.Config{}); err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := st.agg.Run(ctx); err != nil {
			tb.Errorf("aggregator: %v", err)
		}
	}()
	tb.Cleanup(func() { cancel(); <-done })
	return st
}

// A small load run in `make test`: every simulated agent and gateway on
// its own connection with its own role's credentials; the summaries equal
// a recount, no update is lost, every write is seen counted, and every
// gateway applies each apply's routing.
func TestLoadRunWithRoleCredentials(t *testing.T) {
	st := startStorage(t, 1)
	rep, err := fleetsim.RunLoad(context.Background(), st.s, fleetsim.LoadSpec{Machines: 30, Namespaces: 10, PerNamespace: 6,
		Rate: 400, Duration: 2 * time.Second, Gateways: 3, Applies: 2, Beat: time.Second, Dialer: st.dialer})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lost != nil || rep.SummaryErr != nil || rep.Unseen != 0 {
		t.Fatalf("lost: %v; summaries: %v; %d writes never counted", rep.Lost, rep.SummaryErr, rep.Unseen)
	}
	// Applies during the writes start on a schedule and none starts once
	// the writes are over: under the race detector on a loaded box the
	// second may not start in time. At least one must, and every gateway
	// applies each that does.
	if rep.Churn.Writes < 400 || len(rep.StatusLag) != rep.Churn.Writes || len(rep.CommitLagIdle) != 6 ||
		len(rep.CommitLagBusy) < 3 || len(rep.CommitLagBusy)%3 != 0 {
		t.Fatalf("%+v; %d lags, %d idle and %d busy commit lags", rep.Churn, len(rep.StatusLag), len(rep.CommitLagIdle), len(rep.CommitLagBusy))
	}
	t.Logf("%.0f writes/s; status lag p99 %s; commit to 3 gateways p99 %s idle, %s busy", rep.Churn.Rate(),
		fleetsim.Percentile(rep.StatusLag, 99), fleetsim.Percentile(sorted(rep.CommitLagIdle), 99), fleetsim.Percentile(sorted(rep.CommitLagBusy), 99))
}

func sorted(d []time.Duration) []time.Duration { return slices.Sorted(slices.Values(d)) }

var (
	loadMachines = flag.Int("fleet.machines", 10000, "BenchmarkFleetLoad: simulated machines")
	loadNS       = flag.Int("fleet.namespaces", 1000, "BenchmarkFleetLoad: deployments (namespaces)")
	loadPerNS    = flag.Int("fleet.per-namespace", 10, "BenchmarkFleetLoad: instances per namespace")
	loadRate     = flag.Int("fleet.rate", 10000, "BenchmarkFleetLoad: instance state changes per second")
	loadBurst    = flag.Int("fleet.burst", 1, "BenchmarkFleetLoad: changes to one machine's instances at a time")
	loadDuration = flag.Duration("fleet.duration", time.Minute, "BenchmarkFleetLoad: how long the writes go on")
	loadGateways = flag.Int("fleet.gateways", 100, "BenchmarkFleetLoad: simulated gateways (routing projections)")
	loadApplies  = flag.Int("fleet.applies", 5, "BenchmarkFleetLoad: applies measured to every gateway, before and during the writes")
)

// BenchmarkFleetLoad is the fleet load figures of BENCHMARKS.md on one storage node and on
// a three-node cluster whose third node is killed halfway: a fleet of
// simulated agents and gateways, each on its own connection with its
// role's credentials, writing instance states at a rate while applies go
// through. Run it alone (it is sized for the whole machine):
//
//	go test -run '^$' -bench FleetLoad -benchtime 1x -timeout 30m ./control/fleetsim/
//
// Smaller: -fleet.machines 1000 -fleet.duration 10s, etc.
func BenchmarkFleetLoad(b *testing.B) {
	// Each connection is two files here: the client's and the server's.
	if err := fleetsim.RaiseFileLimit(uint64(2*(*loadMachines+*loadGateways)) + 4096); err != nil {
		b.Skipf("%v: needs CAP_SYS_RESOURCE; use fewer -fleet.machines, or control/fleetsim/bench/bench.sh, whose server is another process", err)
	}
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			for range b.N {
				st := startStorage(b, nodes)
				spec := fleetsim.LoadSpec{Machines: *loadMachines, Namespaces: *loadNS, PerNamespace: *loadPerNS,
					Rate: *loadRate, Burst: *loadBurst, Duration: *loadDuration, Gateways: *loadGateways, Applies: *loadApplies,
					Dialer: st.dialer, Log: benchLog{b}}
				if nodes > 1 {
					spec.Midway = func() string {
						st.nodes[2].Shutdown()
						st.nodes[2].WaitForShutdown()
						return "storage node s3 shut down"
					}
				}
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				before := ms.HeapAlloc
				rep, err := fleetsim.RunLoad(context.Background(), st.s, spec)
				if err != nil {
					b.Fatal(err)
				}
				if rep.Lost != nil || rep.SummaryErr != nil {
					b.Errorf("lost: %v; summaries: %v", rep.Lost, rep.SummaryErr)
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				b.Logf("%s", rep.Summary())
				b.Logf("heap after the run %.0f MB (before %.0f MB): the aggregator shares this process with %d agents, %d gateways and the storage nodes",
					float64(ms.HeapAlloc)/(1<<20), float64(before)/(1<<20), spec.Machines, spec.Gateways)
				b.ReportMetric(fleetsim.Percentile(rep.StatusLag, 99).Seconds()*1000, "status-lag-p99-ms")
				b.ReportMetric(fleetsim.Percentile(sorted(rep.CommitLagBusy), 99).Seconds()*1000, "commit-to-gateways-p99-ms")
				b.ReportMetric(rep.Churn.Rate(), "writes/s")
			}
		})
	}
}

type benchLog struct{ b *testing.B }

func (l benchLog) Write(p []byte) (int, error) {
	l.b.Logf("%s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// Changes that come in bursts to one machine's instances share that
// machine's observation writes, and none is lost: the store ends as the
// agents last had each change acknowledged, and the summaries equal a
// recount.
func TestBurstsShareObservationWrites(t *testing.T) {
	srv, f := startFleet(t, 10)
	ctx, cancel := context.WithCancel(context.Background())
	agg, err := fleet.New(srv.Store, fleet.Config{FlushEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	})
	if err := f.Place(ctx, 10, 8); err != nil { // 8 instances on each machine
		t.Fatal(err)
	}
	res, err := f.Churn(ctx, 2000, time.Second, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d changes in %d observation writes", res.Writes, res.Stored)
	if res.Writes < 1000 || res.Stored == 0 || res.Stored >= res.Writes {
		t.Fatalf("%d changes took %d observation writes: want fewer writes than changes", res.Writes, res.Stored)
	}
	if err := f.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fleetsim.VerifySummaries(ctx, srv.Store, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
