package integration

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
	"github.com/edgeplane/edgeplane/store/storetest"
	"github.com/nats-io/nats.go/jetstream"
)

// startAuthGateway starts gateway name on an auth cluster with gateway
// credentials bound to its name, reporting traffic every second.
func (c *cluster) startAuthGateway(name string) *gateway {
	t := c.t
	g, path, env := c.gatewayConfig(name, map[string]any{"handler": "edgeplane", "load_balancing": map[string]any{"retries": 2}})
	c.gatewayCreds(path, name)
	g.proc = start(t, "caddy "+name, env, bins.caddy, "run", "--config", path)
	g.waitConnected(t, name)
	return g
}

// gatewayCreds gives the gateway config at path credentials of gateway
// name.
func (c *cluster) gatewayCreds(path, name string) {
	t := c.t
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["edgeplane"].(map[string]any)["creds_file"] = c.issueCreds(storagenode.RoleGateway, name)
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// lyingGateway reports, as gateway "liar" with its own credentials, a
// hundred times what gw1 counted of the canary under way in shop: with
// the errors hidden (hide) or with half the new revision's answers made
// 5xx. It stops when ctx ends.
func lyingGateway(ctx context.Context, t *testing.T, c *cluster, hide *atomic.Bool) (wait func()) {
	creds := c.issueCreds(storagenode.RoleGateway, "liar")
	nc, err := store.Connect(store.ConnectOptions{URL: c.url, CredsFile: creds, Name: "liar"})
	if err != nil {
		t.Fatal(err)
	}
	liar, err := store.Open(ctx, nc, c.store.Names)
	if err != nil {
		t.Fatal(err)
	}
	times := func(rc store.RevisionCounts, errs bool) store.RevisionCounts {
		out := store.RevisionCounts{Revision: rc.Revision, Latency: make([]uint64, len(rc.Latency))}
		var n uint64
		for _, k := range rc.Classes {
			n += 100 * k
		}
		out.Classes[1] = n
		if errs {
			out.Classes[1], out.Classes[4] = n/2, n-n/2
		}
		for i, k := range rc.Latency {
			out.Latency[i] = 100 * k
		}
		return out
	}
	// The liar copies each of gw1's reports as it lands (a watch, not a
	// poll): polled every 500 ms, a canary judged within half a second
	// of gw1's first figures was judged without the liar's vote, and the
	// test did not test what it says.
	gatewayTraffic := storetest.Bucket(t, c.store, c.store.Names.GatewayTrafficBucket())
	w, err := gatewayTraffic.Watch(ctx, "gw1")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer nc.Close()
		defer func() { _ = w.Stop() }()
		for {
			var e jetstream.KeyValueEntry
			select {
			case <-ctx.Done():
				return
			case e = <-w.Updates():
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			// What an honest gateway counted (the thief could measure its
			// own share of traffic as well): multiplied by a hundred.
			var honest store.GatewayTraffic
			if err := json.Unmarshal(e.Value(), &honest); err != nil {
				continue
			}
			rep := store.GatewayTraffic{Gateway: "liar", Since: honest.Since, At: time.Now().UTC()}
			for _, s := range honest.Services {
				if s.Canary == nil {
					continue
				}
				lie := s
				lie.Canary = &store.CanaryTraffic{Deploy: s.Canary.Deploy, Old: times(s.Canary.Old, false), New: times(s.Canary.New, !hide.Load())}
				rep.Services = append(rep.Services, lie)
			}
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := liar.PutGatewayTraffic(pctx, &rep); err != nil && ctx.Err() == nil {
				t.Logf("the liar's report: %v", err)
			}
			cancel()
		}
	}()
	return wg.Wait
}

// Three gateways count a canary and one of them, with its own stolen
// gateway credentials, reports a hundred times what an honest one counted:
// hiding a bad revision's errors, it is outvoted and the canary is
// aborted; inventing errors for a good revision, it is outvoted and the
// canary is promoted.
func TestCanaryOutvotesAGatewayReporting100x(t *testing.T) {
	c := newAuthCluster(t)
	c.join("m1")
	gw1, gw2 := c.startAuthGateway("gw1"), c.startAuthGateway("gw2")
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	stop := make(chan struct{})
	collect1, collect2 := gw1.canaryLoad(2, stop), gw2.canaryLoad(2, stop)
	defer func() {
		close(stop)
		collect1()
		collect2()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	var hide atomic.Bool
	hide.Store(true)
	wait := lyingGateway(ctx, t, c, &hide)
	defer func() { cancel(); wait() }()

	bad := canaryV2(`, HELLO_FAIL_EVERY: "20"`, `rollout:
  steps: [{weight: 10, hold: 20s}]
  limits: {max_5xx_ratio: 0.01, min_requests: 20}
`)
	out, errOut, code := c.control(applyArgs(c.manifest("bad.yaml", bad))...)
	if code == 0 || !strings.Contains(errOut+out, "canary_aborted") || !strings.Contains(errOut+out, "gateway votes breach") {
		t.Fatalf("the bad canary, its errors hidden by the liar, was not aborted: exit %d\n%s\n%s", code, out, errOut)
	}
	id := canaryApplyRe.FindStringSubmatch(out)[1]
	st := deployStatus(t, c, "shop", id)
	if len(st.Canary) != 1 || len(st.Canary[0].Judged) != 1 || len(st.Canary[0].Judged[0].Votes) != 3 {
		t.Fatalf("the bad canary's judged figures: %+v", st.Canary)
	}
	t.Logf("bad canary, the liar hiding its errors at 100x: %s", st.Canary[0].Reason)

	hide.Store(false)
	good := canaryV2("", `rollout:
  steps: [{weight: 10, hold: 6s}]
  limits: {min_requests: 20, max_p99_ratio: 4}
`)
	out, errOut, code = c.control(applyArgs(c.manifest("good.yaml", good))...)
	if code != 0 || !strings.Contains(out, "1 canary steps passed") {
		t.Fatalf("the good canary, errors invented by the liar, was not promoted: exit %d\n%s\n%s", code, out, errOut)
	}
	id = canaryApplyRe.FindStringSubmatch(out)[1]
	st = deployStatus(t, c, "shop", id)
	if len(st.Canary) != 1 || st.Canary[0].Verdict != store.CanaryPassed || !strings.Contains(st.Canary[0].Reason, "2 of 3 gateway votes within limits") {
		t.Fatalf("the good canary's step: %+v", st.Canary)
	}
	var liarBreached bool
	for _, v := range st.Canary[0].Judged[0].Votes {
		liarBreached = liarBreached || (v.Gateway == "liar" && v.Breach)
	}
	if !liarBreached {
		t.Fatalf("the liar's invented errors were not in its vote: %+v", st.Canary[0].Judged[0].Votes)
	}
	t.Logf("good canary, the liar inventing errors at 100x: %s", st.Canary[0].Reason)
}
