package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// 17. A gateway credential decides no canary by itself: credentials
// without a gateway name (which could write every gateway's report) are
// not issued at all, and a bound gateway's credentials cannot write
// another gateway's traffic report or routing observation, nor the
// canary cookie key. (Its own report is judged as one vote among the
// gateways': control/deploy's TestCanaryHoldOutvotesAGatewayReporting100x.)
func attackGatewayReportsBound(t *testing.T, f *attackFixture) {
	file := filepath.Join(f.c.dir, "unbound-gateway.creds")
	_, errOut, code := f.c.control("creds", "issue", "--role", "gateway", "--data", f.c.serverDir(), "-o", file)
	if code != 1 || !strings.Contains(errOut, "invalid") || !strings.Contains(errOut, "--machine NAME") {
		t.Fatalf("issuing gateway credentials without a name: exit %d, %s", code, errOut)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the refused issue wrote %s: %v", file, err)
	}
	t.Logf("gateway credentials without a name: refused (%s)", strings.TrimSpace(errOut))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keyBefore, err := f.c.store.CanaryCookieKeyOf(ctx)
	if err != nil || keyBefore == nil {
		t.Fatalf("the canary cookie key: %+v %v", keyBefore, err)
	}
	th := f.as(t, f.gwCreds) // bound to gw1
	th.try(t, "gateway gw1 writes gw2's traffic report", func(ctx context.Context) error {
		return th.st.PutGatewayTraffic(ctx, &store.GatewayTraffic{Gateway: "gw2", Since: time.Now(), At: time.Now().UTC()})
	})
	th.try(t, "gateway gw1 writes gw2's routing observation", func(ctx context.Context) error {
		return th.st.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw2", AppliedSeq: 1 << 40, At: time.Now().UTC()})
	})
	thCanaryKeys := storetest.Bucket(t, th.st, th.st.Names.CanaryKeysBucket())
	th.try(t, "gateway gw1 replaces the canary cookie key", func(ctx context.Context) error {
		_, err := thCanaryKeys.Put(ctx, store.CanaryCookieKeyName, []byte(`{"version":1,"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
		return err
	})
	// Nothing of it landed.
	gateways := storetest.Bucket(t, f.c.store, f.c.store.Names.GatewaysBucket())
	gatewayTraffic := storetest.Bucket(t, f.c.store, f.c.store.Names.GatewayTrafficBucket())
	for _, kv := range []jetstream.KeyValue{gatewayTraffic, gateways} {
		if _, err := kv.Get(ctx, "gw2"); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("%s has a gw2 record: %v", kv.Bucket(), err)
		}
	}
	if k, err := f.c.store.CanaryCookieKeyOf(ctx); err != nil || k == nil || string(k.Key) != string(keyBefore.Key) {
		t.Fatalf("the canary cookie key changed: %v", err)
	}
}

// canaryRequest sends GET / for shop.example.com through g with the
// bucket cookie value (none if ""), and returns the answering release's
// VERSION and the bucket cookie the gateway set.
func canaryRequest(t *testing.T, g *gateway, cookie string) (version, set string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/?format=json", nil)
	req.Host = "shop.example.com"
	if cookie != "" {
		req.Header.Set("Cookie", store.StickyCookie+"="+cookie)
	}
	resp, err := gwClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET during the canary: %d %s", resp.StatusCode, b)
	}
	var info map[string]string
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == store.StickyCookie {
			set = ck.Value
		}
	}
	return info["version"], set
}

// reportedSides waits for gateway gw1 to report after since and returns
// its counts of each side of deploy's canary of shop/web: what the
// control plane judges.
func reportedSides(t *testing.T, f *attackFixture, deploy string, since time.Time) (old, fresh uint64) {
	t.Helper()
	gatewayTraffic := storetest.Bucket(t, f.c.store, f.c.store.Names.GatewayTrafficBucket())
	eventually(t, 20*time.Second, "gw1 to report its canary counters", func() bool {
		var rep store.GatewayTraffic
		if _, err := store.GetJSON(context.Background(), gatewayTraffic, "gw1", &rep); err != nil || !rep.At.After(since) {
			return false
		}
		old, fresh = 0, 0
		for _, s := range rep.Services {
			if s.Namespace == "shop" && s.Service == "web" && s.Canary != nil && s.Canary.Deploy == deploy {
				for i := range s.Canary.New.Classes {
					old += s.Canary.Old.Classes[i]
					fresh += s.Canary.New.Classes[i]
				}
				return true
			}
		}
		return false
	})
	return old, fresh
}

// 18. A client floods the new side of a sticky canary with forged bucket
// cookies (unsigned, tampered, signed for another canary): the gateway
// treats each as no cookie, splitting it by the weight as a new client
// and handing it a signed cookie, so the flood moves the judged figures
// no more towards the new side than new clients would; a client
// repeating a real new-side cookie counts at most 100 requests a second.
// The canary (an operator's act) is then aborted, and the fixture
// deploys again so that what it compares is the state after it.
func attackForgedCanaryCookies(t *testing.T, f *attackFixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ck, err := f.c.store.CanaryCookieKeyOf(ctx)
	if err != nil || ck == nil {
		t.Fatalf("the canary cookie key: %+v %v", ck, err)
	}
	live := fmt.Sprint(f.version)
	m := strings.Replace(helloV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d-canary"`, f.version), 1) + `rollout:
  sticky: true
  steps: [{weight: 10, hold: 5m}]
`
	p := f.c.startApply("apply with a sticky canary", nil, applyArgs(f.c.manifest("sticky-canary.yaml", m))...)
	p.waitOutput(t, `deploy \S+ of shop`, 30*time.Second)
	id := canaryApplyRe.FindStringSubmatch(p.output())[1]
	waitHolding(t, f.c, id, 1, 60*time.Second)
	eventually(t, 20*time.Second, "the gateway to split shop", func() bool {
		for range 20 {
			if v, _ := canaryRequest(t, f.gw, ""); v != live {
				return true
			}
		}
		return false
	})

	// The flood: every request names bucket 0 (the new side at 10%).
	valid := store.SignCanaryBucket(ck.Key, id, 9999)
	_, mac, _ := strings.Cut(valid, ".")
	forged := []string{"0", "0.AAAAAAAAAAAAAAAAAAAAAA", "0." + mac, store.SignCanaryBucket(ck.Key, "another-deploy", 0)}
	start := time.Now()
	old0, new0 := reportedSides(t, f, id, start)
	const n = 400
	onNew := 0
	for i := range n {
		v, set := canaryRequest(t, f.gw, forged[i%len(forged)])
		bucket, ok := store.CanaryBucketOf(ck.Key, id, set)
		if !ok || (v != live) != (bucket < 1000) {
			t.Fatalf("forged cookie %q: revision %q, cookie set %q (signed %v): want no cookie, a new client's signed one", forged[i%len(forged)], v, set, ok)
		}
		if v != live {
			onNew++
		}
	}
	old1, new1 := reportedSides(t, f, id, time.Now())
	t.Logf("%d requests with forged bucket-0 cookies: %d reached the new revision; judged figures moved old +%d new +%d", n, onNew, old1-old0, new1-new0)
	if onNew != n/10 || new1-new0 != uint64(onNew) || old1-old0 != uint64(n-onNew) {
		t.Fatalf("forged cookies: %d of %d on the new side, counted new +%d old +%d; want %d, as new clients", onNew, n, new1-new0, old1-old0, n/10)
	}

	// A real new-side cookie, repeated by one client: served on its side,
	// counted at most 100 a second.
	kept := ""
	for kept == "" {
		if v, set := canaryRequest(t, f.gw, ""); v != live && set != "" {
			kept = set
		}
	}
	_, new2 := reportedSides(t, f, id, time.Now())
	flood := time.Now()
	const repeat = 600
	for range repeat {
		if v, set := canaryRequest(t, f.gw, kept); v == live || set != "" {
			t.Fatalf("a valid new-side cookie: revision %q, cookie set %q", v, set)
		}
	}
	secs := uint64(time.Since(flood)/time.Second) + 2
	_, new3 := reportedSides(t, f, id, time.Now())
	t.Logf("one client repeating a valid new-side cookie %d times in %s: %d counted", repeat, time.Since(flood).Round(time.Millisecond), new3-new2)
	if new3-new2 > 100*secs {
		t.Fatalf("one client's %d requests counted %d times in under %d s; want at most 100 a second", repeat, new3-new2, secs)
	}

	f.c.mustControl("deploy", "abort", "shop")
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the apply did not end after the abort:\n%s", p.output())
	}
	if st := deployStatus(t, f.c, "shop", id); st.State != store.DeployFailedAfterCheckpoint {
		t.Fatalf("the aborted canary's deploy: %s", st.State)
	}
	f.nextDeploy(t)
}
