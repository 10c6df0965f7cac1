package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// `control signing rotate` while the gateway serves under load and deploys
// go on: no request fails, every deploy during and after the rotation is
// applied (the CLI and the server pick the new key up from the file), the
// old signer ends retired, and what its key signs afterwards is refused.
func TestSigningKeyRotationUnderTraffic(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gw := c.startGateway("gw1")
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", helloV1), "--drain-grace", "200ms", "--gateway-wait", "10s")
	eventually(t, 10*time.Second, "the gateway to serve shop", func() bool {
		code, _, err := gw.request("shop.example.com", "/")
		return err == nil && code == 200
	})
	old, err := signing.ReadKeyFile(c.signerFile())
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	l, wg := gw.runLoad("shop.example.com", 8, stop)
	// Deploys beside the rotation, each signed with whatever the key file
	// holds when it signs.
	deploys := make(chan error, 1)
	go func() {
		for v := 2; v <= 5; v++ {
			manifest := strings.Replace(helloV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d"`, v), 1)
			out, errOut, code := c.control("deploy", "apply", "-f", c.manifest(fmt.Sprintf("v%d.yaml", v), manifest), "--drain-grace", "200ms", "--gateway-wait", "10s")
			if code != 0 {
				deploys <- fmt.Errorf("deploy v%d: exit %d\n%s\n%s", v, code, out, errOut)
				return
			}
		}
		deploys <- nil
	}()
	out := c.mustControl("signing", "rotate", "--data", c.serverDir(), "--grace", "1s")
	t.Logf("%s", strings.TrimSpace(out))
	if err := <-deploys; err != nil {
		t.Fatal(err)
	}
	fresh, err := signing.ReadKeyFile(c.signerFile())
	if err != nil || fresh.PublicKey() == old.PublicKey() {
		t.Fatalf("key file after rotation: %v, same key %v", err, fresh != nil && fresh.PublicKey() == old.PublicKey())
	}
	// One more deploy after the rotation, and the gateway serves it.
	manifest := strings.Replace(helloV1, `VERSION: "1"`, `VERSION: "6"`, 1)
	c.mustControl("deploy", "apply", "-f", c.manifest("v6.yaml", manifest), "--drain-grace", "200ms", "--gateway-wait", "10s")
	var webIDs = map[string]bool{}
	for _, in := range c.instances("shop") {
		if in.Service == "web" {
			webIDs[in.ID] = true
		}
	}
	eventually(t, 10*time.Second, "the gateway to serve the deploy after the rotation", func() bool {
		_, inst, err := gw.request("shop.example.com", "/")
		return err == nil && webIDs[inst]
	})
	close(stop)
	wg.Wait()
	if n := l.failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed across the rotation: %v", n, n+l.ok.Load(), l.errs)
	}
	t.Logf("rotation under load: %d requests, 0 failed; 5 deploys applied during and after it", l.ok.Load())

	var ls struct {
		Signers []store.SignerRecord `json:"signers"`
	}
	if err := json.Unmarshal([]byte(c.mustControl("signing", "ls", "-o", "json")), &ls); err != nil {
		t.Fatal(err)
	}
	states := map[string]bool{}
	for _, r := range ls.Signers {
		states[r.Key] = r.Retired != nil
	}
	if !states[old.PublicKey()] || states[fresh.PublicKey()] {
		t.Fatalf("signers after rotation: %+v", ls.Signers)
	}

	// The old key, in a thief's hands: what it signs now is refused.
	before, _ := gw.projectionFull()
	routes := routesOf(t, gw)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subj := c.store.Names.RoutingServiceSubject("shop", "web")
	info, err := storetest.Stream(t, c.store, c.store.Names.RoutingEventsStream()).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(store.RoutingEvent{Version: 1, Kind: store.EventServiceUpsert, Namespace: "shop", Service: "web",
		Routes: []store.Route{{Hosts: []string{"shop.example.com"}}}, Endpoints: []store.Endpoint{{InstanceID: "evil", Address: "203.0.113.9", Port: 80}}})
	m := nats.NewMsg(subj)
	m.Data = forged
	m.Header.Set(signing.Header, old.Sign(signing.Message{Subject: subj, Seq: info.State.LastSeq + 1, Body: forged}))
	if _, err := c.store.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the gateway to refuse the retired key's event", func() bool {
		st, err := gw.projectionFull()
		return err == nil && st.Signatures.Refused == before.Signatures.Refused+1
	})
	if st, _ := gw.projectionFull(); !strings.Contains(st.Signatures.LastRefusal, "retired") {
		t.Fatalf("refusal: %q", st.Signatures.LastRefusal)
	}
	if got := routesOf(t, gw); got != routes {
		t.Fatalf("routes changed by the retired key's event:\n%s\nwas\n%s", got, routes)
	}
}
