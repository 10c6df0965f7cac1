package dashboard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// The overview's regions panel: each region's state (and who set it),
// what runs there and its traffic, from the same reads as `control
// status`; a fleet without regions has no panel. In a browser (when
// chromium is installed) the panel shows, and a region state set while
// the page is open reaches it through the page's live refresh.
func TestOverviewShowsRegions(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	d, err := New(s, Config{DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	overview := func() string {
		t.Helper()
		d.cache.forget()
		code, body, _ := get(t, srv, "GET", "/", nil, nil)
		if code != http.StatusOK {
			t.Fatalf("overview: %d %s", code, body)
		}
		return body
	}
	if body := overview(); strings.Contains(body, `id="regions"`) {
		t.Error("a regions panel in a fleet without regions")
	}

	now := time.Now().UTC()
	for id, region := range map[string]string{"m1": "fra", "m2": "tyo"} {
		if err := s.PutMachine(ctx, &store.MachineRecord{ID: id, Region: region, State: store.MachineActive, Address: "10.0.0.1", JoinedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw-tyo", Region: "tyo", AppliedSeq: 1, At: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: "tyo", State: store.RegionDraining, By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNamespaceStatus(ctx, &store.NamespaceStatus{Namespace: "shop", Counts: store.Counts{Ready: 2},
		Machines: map[string]store.Counts{"m1": {Ready: 2}},
		Traffic: map[string]store.ServiceTrafficStatus{"web": {Regions: map[string]store.RegionTraffic{
			"fra": {Served: 900, ServedRate: 42},
			"tyo": {Arrived: 400, ArrivedRate: 40, Crossed: 400, CrossedRate: 40},
		}}}, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	body := overview()
	for _, want := range []string{
		`<section id="regions">`,
		`<tr data-region="fra"><td>fra</td>` + "\n" + `<td class="state">active</td>` + "\n" +
			`<td class="n">1</td><td class="n">0</td><td class="n">2</td><td class="n">2</td>` + "\n" +
			`<td class="n served">42.0</td><td class="n arrived">0.0</td><td class="n crossed">0.00%</td></tr>`,
		`<tr data-region="tyo"><td>tyo</td>` + "\n" + `<td class="state warn">draining (by ops)</td>`,
		`<td class="n served">0.0</td><td class="n arrived">40.0</td><td class="n crossed warn">100.00%</td></tr>`,
		`<td>gw-tyo <small>tyo</small></td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview lacks %q", want)
		}
	}
	if t.Failed() {
		i := strings.Index(body, `<section id="regions">`)
		t.Logf("overview from the regions panel on:\n%.1500s", body[max(0, i):])
	}

	if t.Failed() {
		return
	}

	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Log("chromium not installed: the panel in a browser is left out")
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); d.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	// tyoState is the text of tyo's state in the open page, once it shows
	// want (or the last seen after 20 s).
	tyoState := func(want string) string {
		t.Helper()
		var got string
		for deadline := time.Now().Add(20 * time.Second); got != want && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got, err = chromedp.Run(bctx, chromedp.Evaluate[string](
				`(document.querySelector('#regions tr[data-region="tyo"] td.state') || {}).textContent || ""`)); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	if state := tyoState("draining (by ops)"); state != "draining (by ops)" {
		t.Errorf("tyo's state in the browser: %q", state)
	}
	if _, err := s.SetRegionState(ctx, store.RegionRecord{Name: "tyo", State: store.RegionDisabled, By: "ops"}); err != nil {
		t.Fatal(err)
	}
	// The overview refreshes itself every few seconds (ages move with
	// time), so the new state shows without a reload.
	state := tyoState("disabled (by ops)")
	if state != "disabled (by ops)" {
		t.Errorf("tyo's state in the open page after it was disabled: %q", state)
	}
}
