package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

const maintV1 = `
namespace: shop
services:
  web:
    command: ["@HELLO@"]
    replicas: 2
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [shop.example.com]}]
  api:
    command: ["@HELLO@"]
    replicas: 1
    readiness: {path: /healthz, timeout: 10s}
    routes: [{hosts: [api.shop.example.com]}]
`

// maintAnswer sends GET / with Host host and Accept accept through g.
func maintAnswer(g *gateway, host, accept string) (int, http.Header, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/", nil)
	req.Host = host
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := gwClient.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), nil
}

// untilEvery polls every gateway at once, from the moment it is called,
// until each answers host as ok says, and returns how long each took
// (failing the test after bound).
func untilEvery(t *testing.T, gws []*gateway, host string, bound time.Duration, ok func(code int, h http.Header) bool) []time.Duration {
	t.Helper()
	begin := time.Now()
	took := make([]time.Duration, len(gws))
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(begin) < bound {
				if code, h, _, err := maintAnswer(g, host, ""); err == nil && ok(code, h) {
					took[i] = time.Since(begin)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			took[i] = -1
		}()
	}
	wg.Wait()
	for i, d := range took {
		if d < 0 {
			t.Fatalf("gateway %d did not answer %s as wanted within %s", i+1, host, bound)
		}
	}
	return took
}

// Maintenance on and off under load at two gateways: once `control
// maintenance on` returns, every gateway answers 503 with Retry-After
// within 1 s (measured: the slowest gateway's lag after the command
// returned), HTML or JSON by Accept, while the namespace's other service
// taken out by its own off is served; no instance is restarted (the same
// IDs and PIDs); off serves the instances again at every gateway.
func TestMaintenanceOnAndOffUnderLoad(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gws := []*gateway{c.startGateway("gw1"), c.startGateway("gw2")}
	c.mustControl("deploy", "apply", "-f", c.manifest("shop.yaml", maintV1), "--drain-grace", "100ms", "--gateway-wait", "10s")
	pids := func() map[string]int {
		out := map[string]int{}
		for _, in := range c.instances("shop") {
			out[in.ID] = in.PID
		}
		return out
	}
	before := pids()
	if len(before) != 3 {
		t.Fatalf("instances %v, want 3", before)
	}
	for _, g := range gws {
		if code, _, body, err := maintAnswer(g, "shop.example.com", ""); err != nil || code != 200 {
			t.Fatalf("before maintenance: %d %q %v", code, body, err)
		}
	}
	// Load on both gateways through the whole test: what it sees is
	// counted by status, to show no answer but 200 and 503 appeared.
	stop := make(chan struct{})
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for _, g := range gws {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					code, _, _, err := maintAnswer(g, "shop.example.com", "")
					if err != nil {
						code = -1
					}
					mu.Lock()
					statuses[code]++
					mu.Unlock()
				}
			}()
		}
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)

	begin := time.Now()
	out := c.mustControl("maintenance", "on", "shop", "--message", "Upgrading <db>", "--retry-after", "45s")
	cmd := time.Since(begin)
	if !strings.Contains(out, "shop is under maintenance") {
		t.Fatalf("maintenance on: %q", out)
	}
	lag := untilEvery(t, gws, "shop.example.com", 5*time.Second, func(code int, h http.Header) bool {
		return code == 503 && h.Get("Retry-After") == "45"
	})
	worst := max(lag[0], lag[1])
	t.Logf("maintenance on: the command took %s; every gateway answered 503 with Retry-After %s after it returned (gw1 %s, gw2 %s)",
		cmd.Round(time.Millisecond), worst.Round(time.Millisecond), lag[0].Round(time.Millisecond), lag[1].Round(time.Millisecond))
	if worst > time.Second {
		t.Errorf("a gateway answered 503 %s after the command returned, want <= 1s", worst)
	}
	out = c.mustControl("maintenance", "off", "shop", "api", "--wait", "5s")
	if !strings.Contains(out, "2/2 gateways applied it") {
		t.Fatalf("maintenance off shop api --wait: %q", out)
	}
	for _, g := range gws {
		code, h, body, err := maintAnswer(g, "shop.example.com", "text/html")
		if err != nil || code != 503 || h.Get("Content-Type") != "text/html; charset=utf-8" || !strings.Contains(body, "Upgrading &lt;db&gt;") {
			t.Errorf("HTML: %d %v %q %v", code, h, body, err)
		}
		code, _, body, err = maintAnswer(g, "shop.example.com", "application/json")
		var got map[string]any
		if err != nil || code != 503 || json.Unmarshal([]byte(body), &got) != nil || got["error"] != "maintenance" ||
			got["message"] != "Upgrading <db>" || got["retry_after"] != float64(45) {
			t.Errorf("JSON: %d %q %v", code, body, err)
		}
		if code, _, body, err := maintAnswer(g, "api.shop.example.com", ""); err != nil || code != 200 {
			t.Errorf("api, taken out by its own off: %d %q %v", code, body, err)
		}
	}
	ls := c.mustControl("maintenance", "ls")
	if !strings.Contains(ls, "shop") || !strings.Contains(ls, "Upgrading <db>") {
		t.Errorf("maintenance ls:\n%s", ls)
	}

	begin = time.Now()
	c.mustControl("maintenance", "off", "shop")
	cmd = time.Since(begin)
	lag = untilEvery(t, gws, "shop.example.com", 5*time.Second, func(code int, _ http.Header) bool { return code == 200 })
	worst = max(lag[0], lag[1])
	t.Logf("maintenance off: the command took %s; every gateway served the instances again %s after it returned",
		cmd.Round(time.Millisecond), worst.Round(time.Millisecond))
	if worst > time.Second {
		t.Errorf("a gateway still answered maintenance %s after off returned, want <= 1s", worst)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	seen := fmt.Sprint(statuses)
	other, ok, unavailable := 0, statuses[200], statuses[503]
	for code, n := range statuses {
		if code != 200 && code != 503 {
			other += n
		}
	}
	mu.Unlock()
	t.Logf("answers under load by status: %s", seen)
	if other > 0 || ok == 0 || unavailable == 0 {
		t.Errorf("answers under load: %s, want 200s and 503s only", seen)
	}
	if after := pids(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("instances changed: %v, were %v", after, before)
	}
}
