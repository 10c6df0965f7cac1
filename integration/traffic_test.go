package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// TestFleetTrafficSumsTheGateways sends a known number of requests, some
// answered 5xx by the app, through two gateways, and reads the control
// plane's sum of them: `control status` and `control deploy status` show
// what was sent within one report interval (1 s here) plus the
// aggregator's flush, and the server's /metrics the same.
func TestFleetTrafficSumsTheGateways(t *testing.T) {
	metrics := freeAddr(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}, serverArgs: []string{"--metrics-listen", metrics}}
	c.startServer("127.0.0.1:0")
	t.Cleanup(c.killInstances)
	c.join("m1")
	names := []string{"gw1", "gw2"}
	gws := []*gateway{c.startGateway(names[0]), c.startGateway(names[1])}
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--gateway-wait", "10s")

	// gw1: 270 answered 200 and 30 answered 500; gw2: 180 and 20 503s.
	sent := map[string][2]int{"gw1": {270, 30}, "gw2": {180, 20}}
	for i, g := range gws {
		name := names[i]
		n := sent[name]
		for j := 0; j < n[0]+n[1]; j++ {
			path, want := "/", 200
			if j < n[1] {
				path, want = fmt.Sprintf("/status/%d", 500+3*i), 500+3*i
			}
			code, _, err := g.request("shop.example.com", path)
			if err != nil || code != want {
				t.Fatalf("request %d through %s: %d %v, want %d", j, name, code, err, want)
			}
		}
	}
	lastSent := time.Now()

	var web store.ServiceTrafficStatus
	eventually(t, 10*time.Second, "the control plane to sum 500 requests, 50 of them 5xx", func() bool {
		web = c.statusOf("shop").Traffic["web"]
		return web.Requests == 500 && web.Errors == 50
	})
	took := time.Since(lastSent)
	t.Logf("summed %s after the last request: %d requests, %d 5xx; gw1 %d/%d, gw2 %d/%d", took.Round(10*time.Millisecond),
		web.Requests, web.Errors, web.Gateways["gw1"].Requests, web.Gateways["gw1"].Errors, web.Gateways["gw2"].Requests, web.Gateways["gw2"].Errors)
	if g1, g2 := web.Gateways["gw1"], web.Gateways["gw2"]; g1.Requests != 300 || g1.Errors != 30 || g2.Requests != 200 || g2.Errors != 20 {
		t.Errorf("per gateway: %+v", web.Gateways)
	}
	// One report interval (1 s), the aggregator's flush (0.5 s) and the
	// CLI's own start.
	if took > 3*time.Second {
		t.Errorf("the sum took %s after the last request", took)
	}
	// Quantiles cover the gateways' last intervals, which may hold no
	// request by now (control/fleet's tests check their values).
	if web.P99 < web.P50 {
		t.Errorf("latency quantiles: p50 %v p99 %v", web.P50, web.P99)
	}

	out := c.mustControl("status")
	if !strings.Contains(out, "shop/web") || !strings.Contains(out, "REQ/S") {
		t.Errorf("control status shows no traffic:\n%s", out)
	}
	out = c.mustControl("deploy", "status", "shop")
	if !strings.Contains(out, "traffic:   web: ") || !strings.Contains(out, "500 requests") || !strings.Contains(out, "via gw2: ") {
		t.Errorf("deploy status shows no traffic:\n%s", out)
	}
	if m := scrape(t, metrics); !strings.Contains(m, `edgeplane_fleet_service_requests{code_class="5xx",namespace="shop",service="web"} 50`) {
		t.Errorf("server metrics lack the fleet's 5xx count:\n%s", m)
	}
}

// namespaceStatus is one namespace in `control status -o json`.
type namespaceStatus struct {
	Namespace string                                `json:"namespace"`
	Revision  int64                                 `json:"revision"`
	Counts    store.Counts                          `json:"counts"`
	Traffic   map[string]store.ServiceTrafficStatus `json:"traffic"`
}

// statusOf is namespace ns as `control status -o json` shows it.
func (c *cluster) statusOf(ns string) namespaceStatus {
	c.t.Helper()
	var v struct {
		Namespaces []namespaceStatus `json:"namespaces"`
	}
	if err := json.Unmarshal([]byte(c.mustControl("status", "-o", "json")), &v); err != nil {
		c.t.Fatal(err)
	}
	for _, n := range v.Namespaces {
		if n.Namespace == ns {
			return n
		}
	}
	return namespaceStatus{Namespace: ns}
}
