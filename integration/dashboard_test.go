package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// browser starts a headless Chromium (Debian's chromium) for the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Geteuid() == 0 {
			t.Fatal("chromium is not installed: scripts/test-deps.sh installs it")
		}
		t.Skip("chromium is not installed (scripts/test-deps.sh installs it as root)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The browser starts with the first action, on a context with no
	// timeout: it lives as long as that context.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// do runs browser actions, bounded.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// ask runs one browser action that answers, bounded.
func ask[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// screenshot saves the page as name.png in the test's directory, and in
// $EDGEPLANE_SCREENSHOTS when set (control/README.md's pictures are made so).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := ask(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	dirs := []string{t.TempDir()}
	if d := os.Getenv("EDGEPLANE_SCREENSHOTS"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDashboardInABrowser drives the dashboard in a real headless
// Chromium against a real control plane, agent and gateway under load:
// the login (required here by --dashboard-login; off loopback always), a
// wrong token refused, each page's numbers equal to `control status -o
// json`, a deploy applied meanwhile appearing on the open page without a
// reload within 2 s, a <script> in a machine label shown as text and
// never run, and a revoked token logged out. It saves a screenshot of
// each page.
func TestDashboardInABrowser(t *testing.T) {
	ctx := browser(t)
	dash := freeAddr(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--dashboard-listen", dash, "--dashboard-login", "--dashboard-chart-step", "2s"}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	c.agentArgs = []string{"--heartbeat", "1s"}
	const xss = `<script>window.__xss=1</script>`
	c.join("m1", "--label", "note="+xss)
	gw := c.startGateway("gw1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--gateway-wait", "10s")
	stopLoad := make(chan struct{})
	ld, wg := gw.runLoad("shop.example.com", 2, stopLoad)
	t.Cleanup(func() {
		select {
		case <-stopLoad:
		default:
			close(stopLoad)
		}
		wg.Wait()
	})

	var tok struct {
		ID    string `json:"id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(c.mustControl("dashboard", "token", "--name", "browser test", "-o", "json")), &tok); err != nil {
		t.Fatal(err)
	}
	base := "http://" + dash
	url := func(path string) string { return base + path }

	// Not logged in: every page sends the browser to the login; a wrong
	// token is refused.
	do(t, ctx, "opening the dashboard", chromedp.Navigate(url("/")), chromedp.WaitVisible(chromedp.ID("login")))
	loc := ask(t, ctx, "the location", chromedp.Location())
	if !strings.HasSuffix(loc, "/login") {
		t.Fatalf("not logged in, the dashboard showed %s", loc)
	}
	screenshot(t, ctx, "dashboard-login")
	do(t, ctx, "typing a wrong token", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "epd_0123456789ab.wrong"))
	do(t, ctx, "submitting it", chromedp.Click(chromedp.CSS("#login button")))
	do(t, ctx, "its refusal", chromedp.WaitVisible(chromedp.ID("login-error")))
	msg := ask(t, ctx, "the login error", chromedp.Text(chromedp.ID("login-error")))
	if !strings.Contains(msg, "unknown or revoked") {
		t.Fatalf("a wrong token: %q", msg)
	}
	do(t, ctx, "logging in", chromedp.SetValue(chromedp.CSS(`input[name="token"]`), tok.Token),
		chromedp.Click(chromedp.CSS("#login button")), chromedp.WaitVisible(chromedp.ID("namespaces")))

	// The overview's numbers are control status's, once the traffic
	// settles (load stopped, the last report summed).
	time.Sleep(5 * time.Second) // traffic under load for the charts
	close(stopLoad)
	wg.Wait()
	t.Logf("load through the gateway: %d ok, %d failed", ld.ok.Load(), ld.failed.Load())
	type shopStatus struct {
		Revision int64
		Ready    int
		Requests uint64
	}
	statusNow := func() shopStatus {
		n := c.statusOf("shop")
		s := shopStatus{Revision: n.Revision, Ready: n.Counts.Ready}
		for _, tr := range n.Traffic {
			s.Requests += tr.Requests
		}
		return s
	}
	var want shopStatus
	eventually(t, 15*time.Second, "the fleet's request count to settle", func() bool {
		a := statusNow()
		if a.Requests != uint64(ld.ok.Load()+ld.failed.Load()) {
			return false
		}
		want = a
		return true
	})
	var rev, ready, requests string
	eventually(t, 5*time.Second, "the overview to show control status's numbers", func() bool {
		do(t, ctx, "reading the overview", chromedp.Navigate(url("/")), chromedp.WaitVisible(chromedp.ID("namespaces")))
		rev = ask(t, ctx, "the revision", chromedp.Text(chromedp.CSS(`tr[data-ns="shop"] td.revision`)))
		ready = ask(t, ctx, "the ready count", chromedp.Text(chromedp.CSS(`tr[data-ns="shop"] td.ready`)))
		requests = ask(t, ctx, "the requests", chromedp.Text(chromedp.CSS(`tr[data-ns="shop"] td.requests`)))
		return rev == strconv.FormatInt(want.Revision, 10) && ready == strconv.Itoa(want.Ready) && requests == strconv.FormatUint(want.Requests, 10)
	})
	screenshot(t, ctx, "dashboard-overview")

	// A label a machine was invited with is shown as text, never run.
	do(t, ctx, "the machines page", chromedp.Navigate(url("/machines")), chromedp.WaitVisible(chromedp.ID("machine-list")))
	labels := ask(t, ctx, "the labels", chromedp.Text(chromedp.CSS("#machine-list td.labels")))
	ran := ask(t, ctx, "whether the label ran", chromedp.Evaluate[bool](`window.__xss === 1`))
	if ran || !strings.Contains(labels, xss) {
		t.Fatalf("a <script> label: ran %v, shown as %q", ran, labels)
	}

	// The namespace page, open while a deploy is applied: the new
	// revision and its phases appear without a reload.
	do(t, ctx, "the namespace page", chromedp.Navigate(url("/ns/shop")), chromedp.WaitVisible(chromedp.ID("phases")))
	ask(t, ctx, "marking the page", chromedp.Evaluate[int](`window.__loaded = 1`))
	instances := ask(t, ctx, "counting instances", chromedp.Evaluate[int](`document.querySelectorAll("#instances tr[data-instance]").length`))
	if instances != 3 {
		t.Errorf("the namespace page lists %d instances, want 3", instances)
	}
	screenshot(t, ctx, "dashboard-namespace")

	// The traffic charts keep a point per step (2 s here, from
	// --dashboard-chart-step): the seconds of load before show as several
	// points, and the req/s chart's max is the load's, not the latest
	// figures (the load has stopped).
	points := ask(t, ctx, "counting the req/s chart's points",
		chromedp.Evaluate[int](`+((document.querySelector("#traffic figure[data-points]")||{dataset:{}}).dataset.points||0)`))
	caption := ask(t, ctx, "the req/s chart's caption",
		chromedp.Evaluate[string](`(document.querySelector("#traffic figure figcaption")||{}).textContent||""`))
	var last, top float64
	if _, err := fmt.Sscanf(caption, "req/s: %g (max %g, last hour)", &last, &top); err != nil {
		t.Fatalf("the req/s chart's caption %q: %v", caption, err)
	}
	t.Logf("req/s chart: %d points, %s", points, caption)
	if points < 2 {
		t.Errorf("the req/s chart has %d points after seconds of load at a 2 s step, want more than one (one point for all of it: steps never ended)", points)
	}
	if top <= 0 || top < last {
		t.Errorf("the req/s chart's max %g after the load (latest %g): the max is not the load's", top, last)
	}
	prevRev := want.Revision
	applied := make(chan string, 1)
	v2 := c.manifest("v2.yaml", strings.Replace(helloV1, `VERSION: "1"`, `VERSION: "2"`, 1))
	go func() {
		// Not t.Fatal from here: the test's goroutine reads the outcome.
		out, errOut, code := c.control("deploy", "apply", "-f", v2)
		if code != 0 {
			applied <- fmt.Sprintf("exit %d: %s %s", code, out, errOut)
		}
		close(applied)
	}()
	// When the new deploy's status first reaches the store, the clock
	// starts.
	var began time.Time
	eventually(t, 30*time.Second, "the new deploy's status in the store", func() bool {
		var n int
		_ = store.ListJSON(context.Background(), c.store, storetest.Bucket(t, c.store, c.store.Names.DeployStatusBucket()), "shop.*", func(_ string, st *store.DeployStatus) error {
			if st.Revision > prevRev {
				n++
			}
			return nil
		})
		if n > 0 {
			began = time.Now()
		}
		return n > 0
	})
	var shown string
	for {
		shown = ask(t, ctx, "reading the open page", chromedp.Evaluate[string](`(document.getElementById("latest-revision")||{}).textContent||""`))
		if shown == strconv.FormatInt(prevRev+1, 10) {
			break
		}
		if time.Since(began) > 5*time.Second {
			t.Fatalf("the open page still shows revision %q 5 s after the deploy began", shown)
		}
		time.Sleep(20 * time.Millisecond) // polling the page
	}
	live := time.Since(began)
	loaded := ask(t, ctx, "checking the page was not reloaded", chromedp.Evaluate[bool](`window.__loaded === 1`))
	t.Logf("the deploy appeared on the open page %s after its status reached the store (reloaded: %v)", live.Round(time.Millisecond), !loaded)
	if !loaded {
		t.Error("the page was reloaded to show the deploy")
	}
	if live > 2*time.Second {
		t.Errorf("the deploy took %s to appear (goal: 2 s)", live)
	}
	if failed, ok := <-applied; ok {
		t.Fatalf("deploy v2: %s", failed)
	}
	eventually(t, 10*time.Second, "the open page to show the deploy's phases done", func() bool {
		done := ask(t, ctx, "reading phases", chromedp.Evaluate[int](`document.querySelectorAll("#phases li[data-state=done]").length`))
		return done >= 7
	})

	// A machine.
	do(t, ctx, "the machine page", chromedp.Navigate(url("/machine/m1")), chromedp.WaitVisible(chromedp.ID("record")))
	liveness := ask(t, ctx, "m1's liveness", chromedp.Text(chromedp.ID("liveness")))
	if liveness != "fresh" {
		t.Errorf("m1's liveness on its page: %q", liveness)
	}
	screenshot(t, ctx, "dashboard-machine")

	// A revoked token's session ends at its next request.
	c.mustControl("dashboard", "revoke", tok.ID)
	do(t, ctx, "after the revocation", chromedp.Navigate(url("/")), chromedp.WaitVisible(chromedp.ID("login")))
	loc = ask(t, ctx, "the location", chromedp.Location())
	if !strings.HasSuffix(loc, "/login") {
		t.Fatalf("a revoked token still shows %s", loc)
	}
}
