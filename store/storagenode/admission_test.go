package storagenode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sync/errgroup"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// admissionNodeEnv, set to a directory, makes the test binary a storage
// node (credentials and TLS, as `control server` runs one) instead of
// running tests: BenchmarkAdmission measures that process alone, so what
// the agents' side of the connections costs is not counted.
const admissionNodeEnv = "EDGEPLANE_ADMISSION_NODE"

// admissionHeapEnv, set to a file, has the node write its heap profile
// there once its garbage is collected: what each connection holds.
const admissionHeapEnv = "EDGEPLANE_ADMISSION_HEAP"

func TestMain(m *testing.M) {
	if dir := os.Getenv(admissionNodeEnv); dir != "" {
		os.Exit(runAdmissionNode(dir))
	}
	os.Exit(m.Run())
}

// runAdmissionNode runs a storage node in dir, says its client and
// monitoring URLs on stdout, and runs until its stdin closes. SIGUSR1
// collects garbage and returns what is free to the system, so a reading
// of its resident memory after it is what the connections hold.
func runAdmissionNode(dir string) int {
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: filepath.Join(dir, "data"), Listen: "127.0.0.1:0", Auth: auth,
		Configure: func(o *server.Options) error {
			o.HTTPHost, o.HTTPPort = "127.0.0.1", server.RANDOM_PORT
			return nil
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ns.Shutdown()
	ready := make(chan struct{})
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			runtime.GC()
			debug.FreeOSMemory()
			if file := os.Getenv(admissionHeapEnv); file != "" {
				if f, err := os.Create(file); err == nil {
					_ = pprof.WriteHeapProfile(f)
					f.Close()
				}
			}
			ready <- struct{}{}
		}
	}()
	go func() {
		for range ready {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Printf("collected: heap in use %d MB, goroutine stacks %d MB (%d goroutines), runtime %d MB\n", ms.HeapInuse>>20, ms.StackInuse>>20,
				runtime.NumGoroutine(), (ms.MSpanSys+ms.MCacheSys+ms.BuckHashSys+ms.GCSys+ms.OtherSys)>>20)
		}
	}()
	fmt.Printf("%s %s\n", ns.ClientURL(), ns.MonitorAddr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

var admissionAgents = flag.Int("admission.agents", 1000, "BenchmarkAdmission: agents connected to the storage node")

// BenchmarkAdmission is what a storage node spends admitting agents, in its
// own process: its CPU per agent connection (TLS handshake, credentials,
// the subscriptions an agent opens) and per agent's first write, and its
// resident memory per connected agent, right after and once garbage is
// collected. Each agent connects with its own credentials, opens the store
// and answers its RPC subject as control/agent does, then writes its
// heartbeat (the first request, which opens the connection's reply
// subscription).
//
//	go test -run '^$' -bench Admission -benchtime 1x ./store/storagenode/ -admission.agents 2000
func BenchmarkAdmission(b *testing.B) {
	for range b.N {
		admit(b, *admissionAgents)
	}
}

func admit(b *testing.B, agents int) {
	// Every connection is a file on each side; the node inherits the limit.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	dir := b.TempDir()
	node := exec.Command(os.Args[0], "-test.run=^$")
	node.Env = append(os.Environ(), admissionNodeEnv+"="+dir)
	node.Stderr = os.Stderr
	stdin, err := node.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := node.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := node.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = node.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		b.Fatal("the storage node did not start")
	}
	url, monitor, _ := strings.Cut(lines.Text(), " ")
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), false)
	if err != nil {
		b.Fatal(err)
	}
	names, _ := store.NewNames("", "")
	ctx := context.Background()
	control := filepath.Join(dir, "control.creds")
	issueTo(b, auth, storagenode.CredsRequest{Role: storagenode.RoleControl}, control)
	cnc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: control, Name: "provision"})
	if err != nil {
		b.Fatal(err)
	}
	defer cnc.Close()
	if _, err := store.Provision(ctx, cnc, names, store.Layout{}); err != nil {
		b.Fatal(err)
	}
	ids := make([]string, agents)
	for i := range ids {
		ids[i] = fmt.Sprintf("adm%05d", i)
		issueTo(b, auth, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: ids[i], Names: names}, filepath.Join(dir, ids[i]+".creds"))
	}
	pid := node.Process.Pid
	before := sample(b, pid, monitor)
	stores := make([]*store.Store, agents)
	var stopMu sync.Mutex
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
		for _, s := range stores {
			if s != nil {
				s.NC.Close()
			}
		}
	}()
	each := func(fn func(ctx context.Context, i int) error) {
		g, ctx := errgroup.WithContext(ctx)
		g.SetLimit(64)
		for i := range ids {
			g.Go(func() error { return fn(ctx, i) })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	each(func(ctx context.Context, i int) error {
		nc, err := store.Connect(store.ConnectOptions{URL: url, CredsFile: filepath.Join(dir, ids[i]+".creds"), Name: ids[i], ReconnectForever: true})
		if err != nil {
			return err
		}
		s, err := store.Open(ctx, nc, names)
		if err != nil {
			nc.Close()
			return err
		}
		stores[i] = s
		// Serving outlives the group's context, which ends with it.
		stop, err := store.Serve(context.Background(), nc, names.NodeListenSubject(ids[i]), names.NodeQueueGroup(ids[i]), "node."+ids[i],
			func(context.Context, string, []byte) (any, error) { return nil, nil })
		if err != nil {
			return err
		}
		stopMu.Lock()
		stops = append(stops, stop)
		stopMu.Unlock()
		return nil
	})
	connected := time.Since(start)
	admitted := sample(b, pid, monitor)
	each(func(ctx context.Context, i int) error { return stores[i].PutMachineBeat(ctx, ids[i], time.Minute) })
	wrote := sample(b, pid, monitor)
	if err := node.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "collected") {
		b.Fatal("the storage node did not collect its garbage")
	}
	collected := lines.Text()
	settled := sample(b, pid, monitor)

	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(agents) }
	kb := func(from, to int64) float64 { return float64(to-from) / 1024 / float64(agents) }
	b.ReportMetric(per(admitted.cpu-before.cpu), "node-µs/conn")
	b.ReportMetric(per(wrote.cpu-admitted.cpu), "node-µs/first-write")
	b.ReportMetric(kb(before.rss, wrote.rss), "node-KB/conn")
	b.ReportMetric(kb(before.rss, settled.rss), "node-KB/conn-settled")
	b.ReportMetric(float64(wrote.subs-before.subs)/float64(agents), "subs/conn")
	b.Logf("%d agents connected in %s; node CPU %s connecting, %s for their first writes; RSS %d MB before, %d MB after, %d MB settled; %d subscriptions more",
		agents, connected.Round(time.Millisecond), admitted.cpu-before.cpu, wrote.cpu-admitted.cpu, before.rss>>20, wrote.rss>>20, settled.rss>>20, wrote.subs-before.subs)
	b.Logf("node %s", collected)
	b.Logf("one agent's subscriptions: %s", strings.Join(subsOf(b, monitor, ids[0]), ", "))
}

func issueTo(tb testing.TB, auth *storagenode.Auth, req storagenode.CredsRequest, file string) {
	creds, err := auth.IssueCreds(req)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(file, creds, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// nodeSample is a storage node process's CPU time, resident memory and
// subscriptions at one moment.
type nodeSample struct {
	cpu  time.Duration
	rss  int64
	subs int
}

func sample(tb testing.TB, pid int, monitor string) nodeSample {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	var varz struct {
		Subscriptions int `json:"subscriptions"`
	}
	getJSON(tb, "http://"+monitor+"/varz", &varz)
	return nodeSample{cpu: time.Duration(utime+stime) * 10 * time.Millisecond, rss: rssPages * int64(os.Getpagesize()), subs: varz.Subscriptions}
}

// subsOf lists the subscriptions of the connection named name.
func subsOf(tb testing.TB, monitor, name string) []string {
	var connz struct {
		Conns []struct {
			Name string   `json:"name"`
			Subs []string `json:"subscriptions_list"`
		} `json:"connections"`
	}
	getJSON(tb, "http://"+monitor+"/connz?subs=1&limit=100000", &connz)
	for _, c := range connz.Conns {
		if c.Name == name {
			return slices.Sorted(slices.Values(c.Subs))
		}
	}
	return nil
}

func getJSON(tb testing.TB, url string, v any) {
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		tb.Fatalf("%s: %v", url, err)
	}
}

// A node started with storagenode.ProfileEnv serves its Go profiles on
// that port of its loopback listener, and refuses to serve them off
// loopback.
func TestProfilesOnLoopbackOnly(t *testing.T) {
	addr := storetest.FreeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	t.Setenv(storagenode.ProfileEnv, port)
	dir := t.TempDir()
	auth, err := storagenode.LoadAuth(filepath.Join(dir, "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storagenode.Start(storagenode.Config{DataDir: filepath.Join(dir, "wide"), Listen: "0.0.0.0:0", Auth: auth}); err == nil ||
		!strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("a node listening on every address started with profiles: %v", err)
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: filepath.Join(dir, "local"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	var resp *http.Response
	storetest.Eventually(t, 10*time.Second, "the profiles served", func() bool {
		resp, err = http.Get("http://127.0.0.1:" + port + "/debug/pprof/heap?debug=1")
		return err == nil
	})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Fatalf("%s: %.200s", resp.Status, body)
	}
}
