package dashboard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Layer 4 on the pages: the namespace page lists its services' entry
// points below HTTP (live commit), their connections fleet-wide and per
// gateway, and the ports gateways could not open and the drains they
// hold for it; the overview lists the gateways' reports fleet-wide. A
// namespace exposing nothing below HTTP, with nothing reported, has no
// layer-4 section; a gateway's error text is escaped.
func TestPagesShowLayer4(t *testing.T) {
	s := storetest.Start(t).Store
	ctx := context.Background()
	now := time.Now().UTC()
	pend, err := storetest.Prepare(ctx, s, "shop", map[string]storetest.Service{
		"db":  {Instances: []storetest.Instance{{ID: "db-a", Machine: "m1", Address: "10.100.0.5", Port: 5432}}},
		"web": {Instances: []storetest.Instance{{ID: "web-a", Machine: "m1", Address: "10.100.0.5", Port: 8080}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := pend.Deploy.Manifest.Services["db"]
	spec.Layer4 = store.Layer4{TCP: []store.L4Port{{Port: 5432}}, TLSPassthrough: &store.Passthrough{Hosts: []string{"db.example.com"}},
		DrainTimeout: store.Duration(45 * time.Second)}
	pend.Deploy.Manifest.Services["db"] = spec
	if _, err := pend.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := storetest.Deploy(ctx, s, "plain", map[string]storetest.Service{
		"web": {Instances: []storetest.Instance{{ID: "plain-a", Machine: "m1", Address: "10.100.0.5", Port: 8081}}},
	}); err != nil {
		t.Fatal(err)
	}
	l4 := &store.L4Figures{Open: 7, Total: 450, ConnectErrors: 6, Refused: 5, Rate: 150, BytesInRate: 1500, BytesOutRate: 3000}
	if err := s.PutNamespaceStatus(ctx, &store.NamespaceStatus{Namespace: "shop", Counts: store.Counts{Ready: 2},
		Traffic: map[string]store.ServiceTrafficStatus{"db": {TrafficFigures: store.TrafficFigures{L4: l4},
			Gateways: map[string]store.TrafficFigures{"gw1": {L4: &store.L4Figures{Open: 7, Total: 450, Rate: 150, ConnectErrors: 6}}, "gw2": {}}}},
		UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutGatewayObservation(ctx, &store.GatewayObservation{Gateway: "gw1", AppliedSeq: 1, At: now,
		L4Errors: []store.L4PortError{{Port: "tcp/5432", Namespace: "shop", Service: "db", Error: "bind: address already in use <b>", Since: now}},
		L4Draining: []store.L4Drain{
			{Namespace: "shop", Service: "db", Instance: "db-old", Conns: 3, Until: now.Add(time.Minute)},
			{Namespace: "shop", Service: "db", Instance: "db-older", Conns: 1, Until: now.Add(-time.Minute)},
		}}); err != nil {
		t.Fatal(err)
	}

	d, err := New(s, Config{DoctorEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	page := func(path string) string {
		t.Helper()
		d.cache.forget()
		code, body, _ := get(t, srv, "GET", path, nil, nil)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		return body
	}
	errRow := `<tr data-gateway="gw1" data-port="tcp/5432"><td>gw1</td><td>tcp/5432</td><td>shop/db</td><td>` + now.Format("2006-01-02 15:04:05Z") +
		`</td><td class="bad">bind: address already in use &lt;b&gt;</td></tr>`
	ns := page("/ns/shop")
	for _, want := range []string{
		`<section id="layer4">`,
		`<tr data-service="db"><td>db</td><td>tcp/5432 tls/db.example.com</td><td>45s</td></tr>`,
		`layer 4: <span class="l4-rate">150.0</span> conn/s · <span class="l4-open">7</span> open · <span class="l4-total">450</span> connections · 1500.0 B/s in · 3000.0 B/s out · ` +
			`<span class="l4-connect-errors warn">6</span> connect errors · <span class="l4-refused warn">5</span> refused`,
		`<tr data-gateway="gw1"><td>gw1</td><td class="n">0.0</td><td class="n">0.00%</td><td class="n">-</td><td class="n">0</td><td class="n">150.0</td><td class="n">7</td><td class="n">6</td></tr>`,
		`<tr data-gateway="gw2"><td>gw2</td><td class="n">0.0</td><td class="n">0.00%</td><td class="n">-</td><td class="n">0</td><td class="n">-</td><td class="n">-</td><td class="n">-</td></tr>`,
		errRow,
		`<tr data-gateway="gw1" data-instance="db-old"><td>gw1</td><td>db-old</td><td>shop/db</td><td class="n">3</td><td class="">`,
		`<tr data-gateway="gw1" data-instance="db-older"><td>gw1</td><td>db-older</td><td>shop/db</td><td class="n">1</td><td class="bad">` +
			now.Add(-time.Minute).Format("2006-01-02 15:04:05Z") + ` (past its deadline)</td></tr>`,
	} {
		if !strings.Contains(ns, want) {
			t.Errorf("the namespace page lacks %q", want)
		}
	}
	if t.Failed() {
		i := strings.Index(ns, `<section id="layer4">`)
		t.Logf("namespace page from the layer-4 section on:\n%.3000s", ns[max(0, i):])
	}
	if plain := page("/ns/plain"); strings.Contains(plain, `id="layer4"`) || strings.Contains(plain, "layer 4:") {
		t.Error("a layer-4 section for a namespace without any")
	}
	overview := page("/")
	if !strings.Contains(overview, `<section id="layer4">`) || !strings.Contains(overview, errRow) || !strings.Contains(overview, `data-instance="db-older"`) {
		i := strings.Index(overview, `<section id="layer4">`)
		t.Errorf("the overview's layer-4 section:\n%.2000s", overview[max(0, i):])
	}
}
