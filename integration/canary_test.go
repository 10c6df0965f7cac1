package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Progressive delivery through real gateways: a canary judged by the
// gateways' own counters, aborted or promoted.

// canaryV1 is the gateway tests' revision 1 of web (two replicas).
const canaryV1 = gwV1

// canaryV2 is revision 2 of web with env (extra variables of the new
// release) and rollout (the manifest's rollout section).
func canaryV2(env, rollout string) string {
	return strings.Replace(canaryV1, `env: {VERSION: "1"}`, `env: {VERSION: "2"`+env+`}`, 1) + rollout
}

// canaryLoad sends requests for shop.example.com through g from workers
// until stop closes; the returned func gives every outcome with the
// version that answered.
func (g *gateway) canaryLoad(workers int, stop <-chan struct{}) func() []outcome {
	return timedRequests(workers, stop, func() outcome {
		o := outcome{start: time.Now()}
		code, version, err := g.versionOf(gwClient, nil)
		o.ok, o.version, o.code = err == nil && code == 200, version, code
		if !o.ok {
			o.err = fmt.Sprintf("%d %v", code, err)
		}
		return o
	})
}

// versionOf asks the gateway for shop.example.com/ with client, adding
// header, and returns the status and the answering release's VERSION.
func (g *gateway) versionOf(client *http.Client, header http.Header) (int, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/?format=json", nil)
	req.Host = "shop.example.com"
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp.StatusCode, "", nil
	}
	var info map[string]string
	if err := json.Unmarshal(b, &info); err != nil {
		return resp.StatusCode, "", fmt.Errorf("decoding %q: %w", b, err)
	}
	return 200, info["version"], nil
}

// counts returns how many of all started in [from, to) got an answer
// from each version, and how many failed.
func counts(all []outcome, from, to time.Time) (byVersion map[string]int, failed int) {
	byVersion = map[string]int{}
	for _, o := range all {
		if o.start.Before(from) || !o.start.Before(to) {
			continue
		}
		if !o.ok {
			failed++
			continue
		}
		byVersion[o.version]++
	}
	return byVersion, failed
}

// waitHolding waits until deploy id of shop holds canary step step, and
// returns its status.
func waitHolding(t *testing.T, c *cluster, id string, step int, timeout time.Duration) store.DeployStatus {
	t.Helper()
	var st store.DeployStatus
	eventually(t, timeout, fmt.Sprintf("deploy %s to hold canary step %d", id, step), func() bool {
		var s store.DeployStatus
		if _, err := store.GetJSON(context.Background(), storetest.Bucket(c.t, c.store, c.store.Names.DeployStatusBucket()), "shop."+id, &s); err != nil {
			return false
		}
		st = s
		n := len(s.Canary)
		return n >= step && s.Canary[step-1].Verdict == store.CanaryHolding
	})
	return st
}

// canaryRequestsNow sums what the gateways report now for deploy id's new
// revision of web.
func canaryRequestsNow(c *cluster, id string) uint64 {
	var n uint64
	_ = store.ListJSON(context.Background(), c.store, storetest.Bucket(c.t, c.store, c.store.Names.GatewayTrafficBucket()), ">", func(_ string, g *store.GatewayTraffic) error {
		for _, s := range g.Services {
			if s.Namespace == "shop" && s.Service == "web" && s.Canary != nil && s.Canary.Deploy == id {
				for _, k := range s.Canary.New.Classes {
					n += k
				}
			}
		}
		return nil
	})
	return n
}

var canaryApplyRe = regexp.MustCompile(`deploy (\S+) of shop`)

// A candidate that answers every 20th request with a 500 (5% of its
// traffic) is canaried at 10%: the control plane reads the gateways'
// counters, sees its 5xx ratio past the limit and aborts within the hold,
// routing everything back to revision 1 and stopping the candidates. The
// time from the first failed response to the last one revision 2 gave is
// reported against the goal (hold + 5 s), and the failures clients saw
// against the canary's share of that window.
func TestCanaryAbortsABadRevision(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	_, v1IDs := liveIDs(t, c, "shop")
	stop := make(chan struct{})
	collect := gw.canaryLoad(4, stop)

	const hold = 20 * time.Second
	bad := canaryV2(`, HELLO_FAIL_EVERY: "20"`, fmt.Sprintf(`rollout:
  steps: [{weight: 10, hold: %s}]
  limits: {max_5xx_ratio: 0.01, min_requests: 20}
`, hold))
	started := time.Now()
	out, errOut, code := c.control(applyArgs(c.manifest("bad.yaml", bad))...)
	returned := time.Now()
	close(stop)
	all := collect()
	if code == 0 || !strings.Contains(errOut+out, "canary_aborted") || !strings.Contains(errOut+out, "5xx ratio of revision 2") {
		t.Fatalf("the bad canary was not aborted for its 5xx ratio: exit %d\n%s\n%s", code, out, errOut)
	}
	id := canaryApplyRe.FindStringSubmatch(out)[1]
	st := deployStatus(t, c, "shop", id)
	if st.State != store.DeployFailedAfterCheckpoint || st.Error == nil || st.Error.Code != "canary_aborted" || !st.Settled {
		t.Fatalf("status of the aborted canary: %+v", st)
	}
	if len(st.Canary) != 1 || st.Canary[0].Verdict != store.CanaryAborted || len(st.Canary[0].Judged) != 1 {
		t.Fatalf("canary steps recorded: %+v", st.Canary)
	}
	j := st.Canary[0].Judged[0]
	if j.New.Revision != 2 || j.New.Errors == 0 || j.Old.Revision != 1 {
		t.Fatalf("figures judged on: %+v", j)
	}
	// Revision 1 alone serves, and the candidates are gone.
	if id, ids := liveIDs(t, c, "shop"); !slices.Equal(ids, v1IDs) {
		t.Fatalf("live commit %s routes %v, want revision 1's %v", id, ids, v1IDs)
	}
	for range 50 {
		if code, v, err := gw.versionOf(gwClient, nil); err != nil || code != 200 || v != "1" {
			t.Fatalf("after the abort: %d %q %v", code, v, err)
		}
	}
	for _, in := range c.instances("shop") {
		if in.DeployID == id {
			t.Fatalf("candidate %s of the aborted canary is still there: %+v", in.ID, in)
		}
	}
	statusOut := c.mustControl("deploy", "status", "shop")
	if !strings.Contains(statusOut, "canary:    step 1 10% hold 20s: aborted") || !strings.Contains(statusOut, "revision 2 ") {
		t.Errorf("deploy status does not show the judged step:\n%s", statusOut)
	}

	var firstFail, lastV2 time.Time
	for _, o := range all {
		if !o.ok && firstFail.IsZero() {
			firstFail = o.start
		}
		if o.version == "2" {
			lastV2 = o.start
		}
	}
	if firstFail.IsZero() || lastV2.IsZero() {
		t.Fatalf("the load saw no failure (%v) or no revision 2 (%v)", firstFail, lastV2)
	}
	took := lastV2.Sub(firstFail)
	byVersion, failed := counts(all, firstFail, lastV2.Add(time.Nanosecond))
	window := byVersion["1"] + byVersion["2"] + failed
	t.Logf("first failed response → revision 1 at 100%%: %s (goal ≤ hold %s + 5s); apply returned after %s; "+
		"in that window %d requests, %d to revision 2, %d failed (%.2f%%; the canary's share is 10%%); judged on %+v",
		took.Round(10*time.Millisecond), hold, returned.Sub(started).Round(100*time.Millisecond),
		window, byVersion["2"], failed, 100*float64(failed)/float64(max(window, 1)), j)
	if took > hold+5*time.Second {
		t.Errorf("revision 1 took %s to serve everything again after the first failure", took)
	}
	if float64(failed) > 0.10*float64(window) {
		t.Errorf("%d of %d requests failed in the window: more than the canary's 10%% share", failed, window)
	}
}

// A good candidate under load goes through 10% and 50% to its final
// commit without a failed request, and in each step's window the clients
// see the step's share of responses from revision 2.
func TestCanaryPromotesAGoodRevisionStepByStep(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	stop := make(chan struct{})
	collect := gw.canaryLoad(4, stop)
	// A p99 limit of 4x: a fresh revision's first requests are slower on
	// a loaded box, and this test is about weights, not latency.
	good := canaryV2("", `rollout:
  steps: [{weight: 10, hold: 6s}, {weight: 50, hold: 4s}]
  limits: {min_requests: 20, max_p99_ratio: 4}
`)
	out := c.mustControl(applyArgs(c.manifest("good.yaml", good))...)
	id := canaryApplyRe.FindStringSubmatch(out)[1]
	for range 20 {
		if code, v, err := gw.versionOf(gwClient, nil); err != nil || code != 200 || v != "2" {
			t.Fatalf("after the promotion: %d %q %v", code, v, err)
		}
	}
	close(stop)
	outcomes := collect()
	st := deployStatus(t, c, "shop", id)
	if st.State != store.DeployCommitted || !st.Settled || len(st.Canary) != 2 {
		t.Fatalf("status of the promoted canary: %+v", st)
	}
	all, failed := counts(outcomes, time.Time{}, time.Now())
	if failed != 0 {
		var errs []string
		for _, o := range outcomes {
			if !o.ok && len(errs) < 10 {
				errs = append(errs, o.err)
			}
		}
		t.Fatalf("%d of %d requests failed during the canary: %v", failed, all["1"]+all["2"]+failed, errs)
	}
	var report []string
	for _, s := range st.Canary {
		if s.Verdict != store.CanaryPassed {
			t.Fatalf("step %d: %s (%s)", s.Step, s.Verdict, s.Reason)
		}
		byVersion, _ := counts(outcomes, s.StartedAt, s.EndedAt)
		n := byVersion["1"] + byVersion["2"]
		share := 100 * float64(byVersion["2"]) / float64(max(n, 1))
		report = append(report, fmt.Sprintf("step %d (%d%%): %d responses, %.2f%% from revision 2", s.Step, s.Weight, n, share))
		// The gateway sends exactly weight of every 100 it routes; the
		// window's edges cut a few in flight.
		if n < 200 || share < float64(s.Weight)-1.5 || share > float64(s.Weight)+1.5 {
			t.Errorf("step %d at %d%%: %d responses, %.2f%% from revision 2", s.Step, s.Weight, n, share)
		}
	}
	t.Logf("good canary promoted under load: %d requests, 0 failed; %s", all["1"]+all["2"], strings.Join(report, "; "))
	if !strings.Contains(out, "2 canary steps passed") {
		t.Errorf("the apply's output does not say the steps passed:\n%s", out)
	}
}

// With stickiness each client keeps its revision; the match header
// reaches revision 2 whatever the weight; an operator's promote ends the
// hold at once, and an operator's abort routes the next canary back.
func TestCanaryStickyMatchAndManualPromote(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	m := canaryV2("", `rollout:
  sticky: true
  match: {header: X-Canary, value: "yes"}
  steps: [{weight: 50, hold: 5m}]
`)
	p := c.startApply("apply with a sticky canary", nil, applyArgs(c.manifest("sticky.yaml", m))...)
	p.waitOutput(t, `deploy \S+ of shop`, 30*time.Second)
	id := canaryApplyRe.FindStringSubmatch(p.output())[1]
	waitHolding(t, c, id, 1, 30*time.Second)

	// One client, its cookie kept: one revision throughout.
	for i := range 5 {
		jar, _ := cookiejar.New(nil)
		client := &http.Client{Timeout: 5 * time.Second, Jar: jar}
		first := ""
		for j := range 30 {
			code, v, err := gw.versionOf(client, nil)
			if err != nil || code != 200 {
				t.Fatalf("client %d request %d: %d %v", i, j, code, err)
			}
			if first == "" {
				first = v
			}
			if v != first {
				t.Fatalf("client %d flipped from revision %s to %s at request %d", i, first, v, j)
			}
		}
	}
	// New clients without a cookie are split by the weight.
	fresh := map[string]int{}
	for range 100 {
		_, v, _ := gw.versionOf(&http.Client{Timeout: 5 * time.Second}, nil)
		fresh[v]++
	}
	if fresh["1"] < 40 || fresh["2"] < 40 {
		t.Errorf("100 new clients at 50%%: %v", fresh)
	}
	// Testers reach revision 2 by the header, whatever their bucket.
	for range 20 {
		if _, v, _ := gw.versionOf(gwClient, http.Header{"X-Canary": {"yes"}, "Cookie": {store.StickyCookie + "=9999"}}); v != "2" {
			t.Fatalf("a request with the match header reached revision %q", v)
		}
	}
	// A bucket cookie counts only as a gateway signed it, for this canary.
	ck, err := c.store.CanaryCookieKeyOf(context.Background())
	if err != nil || ck == nil {
		t.Fatalf("the canary cookie key: %+v %v", ck, err)
	}
	if _, v, _ := gw.versionOf(gwClient, http.Header{"Cookie": {store.StickyCookie + "=" + store.SignCanaryBucket(ck.Key, id, 0)}}); v != "2" {
		t.Errorf("bucket 0 at 50%% reached revision %q", v)
	}
	if _, v, _ := gw.versionOf(gwClient, http.Header{"Cookie": {store.StickyCookie + "=" + store.SignCanaryBucket(ck.Key, id, 9999)}}); v != "1" {
		t.Errorf("bucket 9999 at 50%% reached revision %q", v)
	}

	promoted := time.Now()
	c.mustControl("deploy", "promote", "shop")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the apply did not finish after the promote:\n%s", p.output())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("apply after promote: exit %d\n%s", code, p.output())
	}
	st := deployStatus(t, c, "shop", id)
	if st.State != store.DeployCommitted || st.Canary[0].Verdict != store.CanaryPromoted || !strings.Contains(st.Canary[0].Reason, "promoted by") {
		t.Fatalf("status after the promote: %+v", st)
	}
	for range 20 {
		if _, v, _ := gw.versionOf(gwClient, nil); v != "2" {
			t.Fatalf("after the promote revision %q answered", v)
		}
	}
	t.Logf("sticky: 5 clients × 30 requests each kept one revision; 100 new clients split %v; promoted by hand, final after %s",
		fresh, time.Since(promoted).Round(100*time.Millisecond))
	// Nothing left to decide.
	if _, errOut, code := c.control("deploy", "abort", "shop"); code == 0 || !strings.Contains(errOut, "no canary under way") {
		t.Errorf("abort without a canary: exit %d %s", code, errOut)
	}

	// An operator's abort: revision 2 serves everything again, the
	// candidates of revision 3 are stopped.
	_, v2IDs := liveIDs(t, c, "shop")
	m3 := strings.Replace(m, `VERSION: "2"`, `VERSION: "3"`, 1)
	p = c.startApply("apply a canary aborted by hand", nil, applyArgs(c.manifest("v3.yaml", m3))...)
	p.waitOutput(t, `deploy \S+ of shop`, 30*time.Second)
	id3 := canaryApplyRe.FindStringSubmatch(p.output())[1]
	waitHolding(t, c, id3, 1, 30*time.Second)
	c.mustControl("deploy", "abort", "shop")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the apply did not finish after the abort:\n%s", p.output())
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(p.output(), "aborted by") {
		t.Fatalf("apply after an abort by hand: exit %d\n%s", code, p.output())
	}
	st = deployStatus(t, c, "shop", id3)
	if st.State != store.DeployFailedAfterCheckpoint || st.Error == nil || st.Error.Code != "canary_aborted" || !st.Settled {
		t.Fatalf("status after the abort by hand: %+v", st)
	}
	if _, ids := liveIDs(t, c, "shop"); !slices.Equal(ids, v2IDs) {
		t.Fatalf("after the abort the live commit routes %v, want %v", ids, v2IDs)
	}
	for range 20 {
		if _, v, _ := gw.versionOf(gwClient, http.Header{"X-Canary": {"yes"}}); v != "2" {
			t.Fatalf("after the abort revision %q answered", v)
		}
	}
	for _, in := range c.instances("shop") {
		if in.DeployID == id3 {
			t.Fatalf("candidate %s of the aborted canary is still there", in.ID)
		}
	}
}

// An orchestrator killed mid canary: the control plane's completer takes
// the namespace lease once it expires and decides as the limits say: a bad
// candidate is aborted, a good one promoted, within the lease TTL and a
// few seconds; the gateway serves throughout.
func TestCanaryOrphanIsDecidedByTheCompleter(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	const ttl = 2 * time.Second
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	stop := make(chan struct{})
	var stopped atomic.Bool
	collect := gw.canaryLoad(4, stop)
	defer func() {
		if !stopped.Load() {
			close(stop)
			collect()
		}
	}()
	var report []string
	for _, tc := range []struct {
		name, env string
		want      store.DeployState
	}{
		{"bad", `, HELLO_FAIL_EVERY: "10"`, store.DeployFailedAfterCheckpoint},
		{"good", "", store.DeployCommitted},
	} {
		m := canaryV2(tc.env, `rollout:
  steps: [{weight: 20, hold: 10m}]
  limits: {min_requests: 20, max_p99_ratio: 4}
`)
		// Paused as its step begins to hold (it would abort a bad
		// canary itself), then killed once the gateways counted enough.
		p := c.startApply("apply a "+tc.name+" canary (killed)",
			[]string{"EDGEPLANE_FAILPOINTS=canary_holding", "EDGEPLANE_FAILPOINT_ACTION=pause"},
			applyArgs(c.manifest(tc.name+".yaml", m))...)
		p.waitOutput(t, regexp.QuoteMeta(failpoint.PausedMarker+"canary_holding"), 60*time.Second)
		id := canaryApplyRe.FindStringSubmatch(p.output())[1]
		waitHolding(t, c, id, 1, 10*time.Second)
		eventually(t, 20*time.Second, "the gateways to count 40 requests of the canary", func() bool { return canaryRequestsNow(c, id) >= 40 })
		p.stop(syscall.SIGKILL)
		killed := time.Now()
		eventually(t, ttl+10*time.Second, "the completer to decide the "+tc.name+" canary", func() bool {
			st := deployStatus(t, c, "shop", id)
			return st.State == tc.want && st.Settled
		})
		took := time.Since(killed)
		st := deployStatus(t, c, "shop", id)
		if len(st.Canary) != 1 || !strings.Contains(st.Canary[0].Reason, "decided by the control plane") {
			t.Fatalf("%s canary's steps: %+v", tc.name, st.Canary)
		}
		want := "1"
		if tc.want == store.DeployCommitted {
			want = "2"
		}
		eventually(t, 10*time.Second, "revision "+want+" alone to answer", func() bool {
			for range 20 {
				if _, v, _ := gw.versionOf(gwClient, nil); v != want {
					return false
				}
			}
			return true
		})
		report = append(report, fmt.Sprintf("%s canary decided %s %s after the kill (lease TTL %s): %s", tc.name, st.State,
			took.Round(100*time.Millisecond), ttl, st.Canary[0].Reason))
	}
	close(stop)
	stopped.Store(true)
	all, failed := counts(collect(), time.Time{}, time.Now())
	t.Logf("\n%s\n%d requests through the gateway, %d failed (the bad canary's own 500s)", strings.Join(report, "\n"), all["1"]+all["2"], failed)
}

// A candidate that answers 150 ms late is aborted for its p99 at a 20%
// step under steady load; the requests it holds at the moment of the abort
// finish before it is stopped, as a replaced instance's do: no client sees
// a failure, only the slow answers.
func TestCanaryAbortDrainsItsCandidates(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl(applyArgs(c.manifest("v1.yaml", canaryV1))...)
	stop := make(chan struct{})
	collect := gw.canaryLoad(4, stop)

	slow := canaryV2(`, HELLO_DELAY: "150ms"`, `rollout:
  steps: [{weight: 20, hold: 20s}]
  limits: {max_p99_ratio: 2, min_requests: 20}
`)
	out, errOut, code := c.control(applyArgs(c.manifest("slow.yaml", slow))...)
	// The apply returns after the candidates stopped: what they held at
	// the abort has been answered, or failed, by now.
	close(stop)
	all := collect()
	if code == 0 || !strings.Contains(errOut+out, "canary_aborted") || !strings.Contains(errOut+out, "p99") {
		t.Fatalf("the slow canary was not aborted for its p99: exit %d\n%s\n%s", code, out, errOut)
	}
	byVersion, failed := counts(all, time.Time{}, time.Now())
	if byVersion["2"] == 0 {
		t.Fatalf("no request reached the candidates: %v", byVersion)
	}
	if failed != 0 {
		var errs []string
		for _, o := range all {
			if !o.ok {
				errs = append(errs, o.err)
			}
		}
		t.Fatalf("%d of %d requests failed around the abort: %v", failed, byVersion["1"]+byVersion["2"]+failed, errs)
	}
	t.Logf("slow canary aborted under load: %d requests (%d to revision 2), 0 failed", byVersion["1"]+byVersion["2"], byVersion["2"])
}
