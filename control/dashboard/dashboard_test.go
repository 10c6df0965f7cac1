package dashboard

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

func TestRequiresLogin(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8090": false, "[::1]:8090": false, "localhost:8090": false, "127.0.0.2:8090": false,
		"0.0.0.0:8090": true, ":8090": true, "[::]:8090": true, "10.0.0.5:8090": true, "dash.example.com:8090": true, "garbage": true,
	} {
		if got := RequiresLogin(addr); got != want {
			t.Errorf("RequiresLogin(%q) = %v, want %v", addr, got, want)
		}
	}
}

// get fetches path from srv with the given headers and returns status,
// body and the response.
func get(t *testing.T, srv *httptest.Server, method, path string, body url.Values, hdr map[string]string) (int, string, *http.Response) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(body.Encode())
	}
	req, _ := http.NewRequest(method, srv.URL+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

// Every name a role can influence reaches the page escaped, behind a
// policy that runs no inline script anyway; the login refuses a wrong
// token and a post from another site, and takes a good one.
func TestPagesEscapeAndLoginGuards(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	const evil = `<script>alert(1)</script>`
	if _, err := store.PutJSON(ctx, storetest.Bucket(t, s, s.Names.MachinesBucket()), "m1", &store.MachineRecord{Version: store.RecordVersion, ID: "m1", State: store.MachineActive,
		Address: "10.100.0.1", Labels: map[string]string{"note": evil}, Region: evil}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := storetest.Deploy(ctx, s, "shop", map[string]storetest.Service{
		"web": {Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
			Instances: []storetest.Instance{{ID: "w1", Machine: "m1", Address: "10.100.0.1", Port: 8080}}},
	}); err != nil {
		t.Fatal(err)
	}
	// m1's agent reports its release and a rolled-back upgrade (the
	// reason carries markup too).
	if err := s.PutMachineState(ctx, &store.MachineState{Machine: "m1", Capacity: 10, Free: 9, Instances: 1, Release: "1.1.0", Arch: "linux/amd64",
		Upgrade: &store.UpgradeStatus{From: "1.1.0", To: "1.2.0", State: "rolled_back", Reason: "sick " + evil, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRollout(ctx, &store.RolloutRecord{ID: "1.2.0-1", Release: "1.2.0", State: store.RolloutFailed, Total: 1,
		FailedMachine: "m1", Reason: "rolled back " + evil, Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// A canary that was aborted, judged on figures (its reason carries
	// markup too).
	if err := s.PutDeployStatus(ctx, &store.DeployStatus{Namespace: "shop", DeployID: "zz-canary", Revision: 2, State: store.DeployFailedAfterCheckpoint,
		Phase: "checkpoint", Canary: []store.CanaryStepStatus{{Step: 1, Weight: 10, Hold: store.Duration(time.Minute), Verdict: store.CanaryAborted,
			Reason: "web: 5xx " + evil, Judged: []store.CanaryFigures{{Service: "web",
				New: store.RevisionTotals{Revision: 2, Requests: 100, Errors: 5, ErrorRatio: 0.05, P99: 0.004},
				Old: store.RevisionTotals{Revision: 1, Requests: 900, P99: 0.003}}}}}}); err != nil {
		t.Fatal(err)
	}
	d, err := New(s, Config{RequireLogin: true, DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)

	code, _, resp := get(t, srv, "GET", "/", nil, nil)
	if code != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("not logged in: %d to %q", code, resp.Header.Get("Location"))
	}
	if code, _, _ = get(t, srv, "GET", "/events", nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("events not logged in: %d", code)
	}
	tok, rec, err := NewToken("test")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutDashboardToken(ctx, rec); err != nil {
		t.Fatal(err)
	}
	form := url.Values{"token": {tok}}
	if code, _, _ = get(t, srv, "POST", "/login", form, map[string]string{"Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("a cross-site login: %d", code)
	}
	if code, _, _ = get(t, srv, "POST", "/login", form, map[string]string{"Origin": "http://evil.example"}); code != http.StatusForbidden {
		t.Errorf("a login from another origin: %d", code)
	}
	if code, body, _ := get(t, srv, "POST", "/login", url.Values{"token": {tok + "x"}}, nil); code != http.StatusUnauthorized || !strings.Contains(body, "unknown or revoked") {
		t.Errorf("a wrong token: %d", code)
	}
	code, _, resp = get(t, srv, "POST", "/login", form, map[string]string{"Sec-Fetch-Site": "same-origin"})
	if code != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("a good login: %d %v", code, resp.Cookies())
	}
	c := resp.Cookies()[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("the session cookie: %+v", c)
	}
	cookie := map[string]string{"Cookie": c.Name + "=" + c.Value}
	for _, path := range []string{"/", "/machines", "/machine/m1", "/ns/shop"} {
		code, body, resp := get(t, srv, "GET", path, nil, cookie)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		if strings.Contains(body, evil) {
			t.Errorf("%s carries the label unescaped", path)
		}
		if path == "/machines" || path == "/machine/m1" {
			if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
				t.Errorf("%s does not show the label as text", path)
			}
		}
		// The release each machine runs, and an upgrade that rolled back.
		for p, want := range map[string][]string{
			"/":           {`<section id="releases">`, "<td>1.1.0</td><td class=\"n\">1</td>", "1.1.0 → 1.2.0: rolled_back (sick", "latest rollout 1.2.0-1 to 1.2.0: failed"},
			"/machines":   {"1.1.0 (rolled_back 1.2.0)"},
			"/machine/m1": {`id="release">1.1.0 linux/amd64`, "1.1.0 → 1.2.0: rolled_back (sick"},
			"/ns/shop": {`<table id="canary">`, `data-verdict="aborted"`, "<td class=\"n\">10%</td><td>1m0s</td>",
				"web: revision 2 100 requests, 5xx 5.00%, p99 4ms | revision 1 900 requests, 5xx 0.00%, p99 3ms"},
		} {
			if p != path {
				continue
			}
			for _, w := range want {
				if !strings.Contains(body, w) {
					t.Errorf("%s lacks %q", path, w)
				}
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: policy %q", path, csp)
		}
	}
	// A fragment is the page's body alone.
	if _, body, _ := get(t, srv, "GET", "/ns/shop", nil, map[string]string{"Cookie": cookie["Cookie"], "X-Fragment": "1"}); strings.Contains(body, "<html") || !strings.Contains(body, "namespace shop") {
		t.Errorf("a fragment: %.200s", body)
	}
	if code, _, _ := get(t, srv, "GET", "/ns/nope", nil, cookie); code != http.StatusNotFound {
		t.Errorf("an unknown namespace: %d", code)
	}
	if code, _, _ := get(t, srv, "GET", "/machine/"+url.PathEscape("a<b"), nil, cookie); code != http.StatusNotFound {
		t.Errorf("a machine name no machine can have: %d", code)
	}
	// Revoked, the cookie stops working at its next request.
	if err := s.DeleteDashboardToken(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(t, srv, "GET", "/", nil, cookie); code != http.StatusSeeOther {
		t.Errorf("a revoked token's session: %d", code)
	}
}

func TestManifestChanges(t *testing.T) {
	two := 2
	a := &store.Manifest{Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"hello"}, Env: map[string]string{"A": "1", "SECRET": "x"}},
		"old": {Command: []string{"old"}},
	}}
	b := &store.Manifest{Services: map[string]store.ServiceSpec{
		"web": {Command: []string{"hello"}, Env: map[string]string{"A": "1", "SECRET": "y", "B": "2"}, Replicas: &two},
		"new": {Command: []string{"new"}},
	}}
	got := strings.Join(manifestChanges(a, b), "; ")
	want := "new: added; web: env SECRET, env B added, replicas; old: removed"
	if got != want {
		t.Errorf("changes:\n got %s\nwant %s", got, want)
	}
	if strings.Contains(got, "y") && strings.Contains(got, `"y"`) {
		t.Error("a value was shown")
	}
	if got := manifestChanges(nil, b); len(got) != 1 || got[0] != "first deploy: new, web" {
		t.Errorf("first deploy: %v", got)
	}
}

func TestHistoryCharts(t *testing.T) {
	var h history
	now := time.Now()
	for i := 0; i < 5; i++ {
		h.add("shop", map[string]store.ServiceTrafficStatus{"web": {TrafficFigures: store.TrafficFigures{Rate: float64(10 * i), P99: 0.01}}},
			now.Add(time.Duration(i-5)*DefaultChartStep))
	}
	// Within one step the latest figures replace the last point.
	h.add("shop", map[string]store.ServiceTrafficStatus{"web": {TrafficFigures: store.TrafficFigures{Rate: 100}}}, now.Add(-DefaultChartStep+time.Second))
	cs := h.charts("shop", "web")
	if len(cs) != 3 || cs[0].Points != 5 || cs[0].Max != "100.0" || cs[0].Last != "100.0" {
		t.Fatalf("charts: %+v", cs[0])
	}
	if strings.ContainsAny(cs[0].Path, "<>\"'&") || !strings.HasPrefix(cs[0].Path, "M") {
		t.Errorf("path %q", cs[0].Path)
	}
	// An hour on, the old points are gone.
	h.add("shop", map[string]store.ServiceTrafficStatus{"web": {}}, now.Add(historySpan+time.Minute))
	h.mu.Lock()
	n := len(h.series["shop"]["web"])
	h.mu.Unlock()
	if n != 1 {
		t.Errorf("%d points after an hour", n)
	}
}

// Summaries come every few seconds, more often than a step: a step still
// ends a step after its first figures, so an hour of traffic is a point
// per step, and the chart's max is the hour's, not the latest figures'.
func TestHistoryKeepsAPointPerStep(t *testing.T) {
	var h history
	start := time.Now().Add(-10 * time.Minute)
	const every = 2 * time.Second
	top := 0.0
	for i := range int(10 * time.Minute / every) {
		rate := float64(100 + i%37)
		if i >= 40 && i < 60 {
			rate = 5000 // 40 s of load, long gone by the end
		}
		top = max(top, rate)
		h.add("shop", map[string]store.ServiceTrafficStatus{"web": {TrafficFigures: store.TrafficFigures{Rate: rate}}}, start.Add(time.Duration(i)*every))
	}
	cs := h.charts("shop", "web")
	want := int(10 * time.Minute / DefaultChartStep)
	if cs[0].Points < want-1 || cs[0].Points > want+1 {
		t.Fatalf("10 minutes of summaries every %s: %d points, want about %d", every, cs[0].Points, want)
	}
	if cs[0].Max != "5000.0" {
		t.Fatalf("max over the hour %s, want the load's 5000.0", cs[0].Max)
	}
}

// With the store gone, a page says so (503 and why), and nothing is
// rendered half.
func TestPagesWithoutTheStore(t *testing.T) {
	srv := storetest.Start(t)
	d, err := New(srv.Store, Config{DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(d)
	t.Cleanup(hs.Close)
	if code, _, _ := get(t, hs, "GET", "/", nil, nil); code != http.StatusOK {
		t.Fatalf("overview with the store up: %d", code)
	}
	srv.NATS.Shutdown()
	srv.NATS.WaitForShutdown()
	d.cache.forget()
	code, body, _ := get(t, hs, "GET", "/", nil, nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `id="error"`) || strings.Contains(body, `id="namespaces"`) {
		t.Fatalf("overview with the store gone: %d %.300s", code, body)
	}
}
