package dashboard

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkPages10k renders each page against a store holding 10,000
// machines (records, heartbeats, agent states) and 1,000 namespaces of 10
// instances each, summarised by a real aggregator: the figure is the time
// to the last byte of each page, served and read over loopback HTTP.
//
//	go test -run '^$' -bench Pages10k -benchtime 20x ./control/dashboard/
func BenchmarkPages10k(b *testing.B) {
	const machines, namespaces, perNS = 10000, 1000, 10
	srv := storetest.Start(b)
	s := srv.Store
	ctx := context.Background()
	now := time.Now().UTC()
	sMachineStates := storetest.Bucket(b, s, s.Names.MachineStatesBucket())
	sMachineBeats := storetest.Bucket(b, s, s.Names.MachineBeatsBucket())
	sMachines := storetest.Bucket(b, s, s.Names.MachinesBucket())
	for i := range machines {
		id := fmt.Sprintf("m%05d", i)
		if _, err := store.PutJSON(ctx, sMachines, id, &store.MachineRecord{Version: store.RecordVersion, ID: id, State: store.MachineActive,
			Address: fmt.Sprintf("10.100.%d.%d", i/250, i%250+1), Labels: map[string]string{"rack": fmt.Sprint(i % 40)}, JoinedAt: now}); err != nil {
			b.Fatal(err)
		}
		if _, err := store.PutJSON(ctx, sMachineBeats, id, &store.MachineBeat{Version: store.RecordVersion, Machine: id, At: now,
			Interval: store.Duration(time.Hour)}); err != nil {
			b.Fatal(err)
		}
		if _, err := store.PutJSON(ctx, sMachineStates, id, &store.MachineState{Version: store.RecordVersion, Machine: id,
			Capacity: 256, Free: 255, StartedAt: now, UpdatedAt: now}); err != nil {
			b.Fatal(err)
		}
	}
	for n := range namespaces {
		ns := fmt.Sprintf("ns%04d", n)
		var insts []storetest.Instance
		for i := range perNS {
			m := (n*perNS + i) % machines
			insts = append(insts, storetest.Instance{ID: fmt.Sprintf("%s-web-%d", ns, i), Machine: fmt.Sprintf("m%05d", m),
				Address: fmt.Sprintf("10.100.%d.%d", m/250, m%250+1), Port: 8000 + i})
		}
		if _, _, err := storetest.Deploy(ctx, s, ns, map[string]storetest.Service{
			"web": {Routes: []store.Route{{Hosts: []string{ns + ".example.com"}}}, Instances: insts}}); err != nil {
			b.Fatal(err)
		}
	}
	agg, err := fleet.New(s, fleet.Config{FlushEvery: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agg.Run(actx) }()
	b.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sums, err := fleet.Read(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		if len(sums) == namespaces {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d namespaces summarised", len(sums), namespaces)
		}
		time.Sleep(100 * time.Millisecond) // polling the store
	}

	d, err := New(s, Config{DoctorEvery: -1})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(d)
	b.Cleanup(hs.Close)
	pages := []string{"/", "/machines?page=50", "/ns/ns0500", "/machine/m05000"}
	fetch := func(path string) time.Duration {
		start := time.Now()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d", path, resp.StatusCode)
		}
		return time.Since(start)
	}
	worst := make([]time.Duration, len(pages))
	total := make([]time.Duration, len(pages))
	b.ResetTimer()
	for range b.N {
		for i, p := range pages {
			d.cache.forget() // every render reads the store afresh
			t := fetch(p)
			total[i] += t
			worst[i] = max(worst[i], t)
		}
	}
	b.StopTimer()
	for i, p := range pages {
		b.ReportMetric(float64(total[i].Microseconds())/float64(b.N)/1000, p+"-ms")
		b.ReportMetric(float64(worst[i].Microseconds())/1000, p+"-worst-ms")
	}
	// The same pages in a real browser: from navigation start to the end
	// of the load event, the worst of five visits each.
	path, err := exec.LookPath("chromium")
	if err != nil {
		b.Log("chromium not installed: browser figures left out")
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.UserDataDir(b.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	cctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(cctx); err != nil {
		b.Fatal(err)
	}
	for _, p := range pages {
		var slowest float64
		for range 5 {
			d.cache.forget()
			tctx, cancel := context.WithTimeout(cctx, 30*time.Second)
			if err := chromedp.Do(tctx, chromedp.Navigate(hs.URL+p)); err != nil {
				cancel()
				b.Fatal(err)
			}
			ms, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`performance.getEntriesByType("navigation")[0].loadEventEnd`))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			slowest = max(slowest, ms)
		}
		b.ReportMetric(slowest, p+"-chromium-worst-ms")
	}
}
