package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// `control logs --access -f` shows the requests of two gateways, each
// with its gateway, status, method, host and path, request ID and the
// instance that answered, as they come; the request IDs are the ones the
// clients sent or the gateways made and answered with; an Authorization
// or Cookie header and the query string never appear, in the follow or
// in -o json.
func TestAccessLogsFromTwoGateways(t *testing.T) {
	c := newCluster(t)
	c.join("m1")
	gws := []*gateway{c.startGateway("gw1"), c.startGateway("gw2")}
	c.mustControl("deploy", "apply", "-f", c.manifest("v1.yaml", gwV1), "--drain-grace", "200ms")
	instances := map[string]bool{}
	for _, in := range c.instances("shop") {
		instances[in.ID] = true
	}
	follow := start(t, "control logs --access -f", c.natsEnv(storagenode.RoleControl, ""), bins.control, "logs", "shop/web", "--access", "-f")

	const secretAuth, secretCookie, secretQuery = "Bearer s3cret-token", "sid=c00kie-value", "qu3ry-secret"
	send := func(g *gateway, rid string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.http+"/cart?token="+secretQuery, nil)
		req.Host = "shop.example.com"
		req.Header.Set("Authorization", secretAuth)
		req.Header.Set("Cookie", secretCookie)
		if rid != "" {
			req.Header.Set("X-Request-ID", rid)
		}
		resp, err := gwClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("through %s: %d", g.http, resp.StatusCode)
		}
		return resp.Header.Get("X-Request-ID")
	}
	// The follow subscribes as it starts: send until both gateways'
	// lines show, each request with an ID of its own; then one request
	// per gateway without one (the gateway makes it).
	var sent []string
	eventually(t, 20*time.Second, "the follow to show both gateways' requests", func() bool {
		for i, g := range gws {
			rid := fmt.Sprintf("client-gw%d-%d", i+1, len(sent))
			if got := send(g, rid); got != rid {
				t.Fatalf("the gateway answered with request ID %q, sent %q", got, rid)
			}
			sent = append(sent, rid)
		}
		out := follow.output()
		return strings.Contains(out, " gw1 200 GET shop.example.com/cart ") && strings.Contains(out, " gw2 200 GET shop.example.com/cart ")
	})
	var made []string
	for _, g := range gws {
		made = append(made, send(g, ""))
	}
	eventually(t, 10*time.Second, "the follow to show the gateway-made request IDs", func() bool {
		out := follow.output()
		for _, id := range made {
			if len(id) != 32 || !strings.Contains(out, "rid="+id+" instance=") {
				return false
			}
		}
		return true
	})
	out := follow.output()
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "rid=") {
			continue
		}
		_, inst, ok := strings.Cut(l, " instance=")
		if !ok || !instances[strings.Fields(inst)[0]] {
			t.Errorf("a line without an instance of shop/web: %q", l)
		}
	}
	last := sent[len(sent)-1]
	if !strings.Contains(out, "rid="+last) {
		t.Errorf("the last request sent (%s) is not in the follow:\n%s", last, out)
	}

	// As published, from the stream: both gateways, nothing secret.
	raw := c.mustControl("logs", "shop/web", "--access", "-o", "json", "--since", "5m")
	byGateway := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		var al store.AccessLine
		if err := json.Unmarshal([]byte(l), &al); err != nil {
			t.Fatalf("-o json line %q: %v", l, err)
		}
		byGateway[al.Gateway]++
		if al.Path != "/cart" || al.Query != "" || al.Headers != nil || al.ClientIP == "" || al.Sample != 1 {
			t.Errorf("line %+v", al)
		}
	}
	if byGateway["gw1"] == 0 || byGateway["gw2"] == 0 {
		t.Fatalf("lines by gateway: %v", byGateway)
	}
	for _, secret := range []string{"s3cret-token", "c00kie-value", secretQuery, "token="} {
		if strings.Contains(out, secret) || strings.Contains(raw, secret) {
			t.Fatalf("%q in the access lines:\n%s\n%s", secret, out, raw)
		}
	}
	t.Logf("follow:\n%s", out)
}
