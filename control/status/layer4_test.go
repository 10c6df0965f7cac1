package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// `control status` shows each service's layer-4 entry points (from its
// live commit) with its connections (from the fleet summary), and under
// each gateway the conflicts it reports, the ports it could not open and
// its drains in progress; the JSON carries the same; `control deploy
// status` adds the connections to the traffic lines.
func TestStatusShowsLayer4(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := srv.Store
	now := time.Now().UTC()

	pend, err := storetest.Prepare(ctx, s, "shop", map[string]storetest.Service{
		"db":  {Instances: []storetest.Instance{{ID: "db-a", Machine: "m1", Address: "10.100.0.5", Port: 5432}}},
		"web": {Instances: []storetest.Instance{{ID: "web-a", Machine: "m1", Address: "10.100.0.5", Port: 8080}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := pend.Deploy.Manifest.Services["db"]
	spec.Layer4 = store.Layer4{TCP: []store.L4Port{{Port: 5432}}, UDP: []store.L4Port{{Port: 5353}},
		TLSPassthrough: &store.Passthrough{Hosts: []string{"db.example.com"}}, DrainTimeout: store.Duration(45 * time.Second)}
	pend.Deploy.Manifest.Services["db"] = spec
	if _, err := pend.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	l4 := &store.L4Figures{Open: 7, Total: 450, BytesIn: 4500, BytesOut: 13000, ConnectErrors: 6, Refused: 5,
		Rate: 150, BytesInRate: 1500, BytesOutRate: 3000}
	if err := s.PutNamespaceStatus(ctx, &store.NamespaceStatus{Namespace: "shop", Counts: store.Counts{Ready: 2},
		Traffic: map[string]store.ServiceTrafficStatus{"db": {TrafficFigures: store.TrafficFigures{L4: l4},
			Gateways: map[string]store.TrafficFigures{"gw1": {L4: l4}}}}, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	obs := &store.GatewayObservation{Gateway: "gw1", AppliedSeq: 1, At: now,
		Conflicts: []string{"tcp/6379: other/cache over shop/cache"},
		L4Errors: []store.L4PortError{{Port: "udp/5353", Namespace: "shop", Service: "db",
			Error: "listen udp 127.0.0.2:5353: bind: address already in use", Since: now.Add(-2 * time.Minute)}},
		L4Draining: []store.L4Drain{
			{Namespace: "shop", Service: "db", Instance: "db-old", Conns: 3, Until: now.Add(20 * time.Second)},
			{Namespace: "shop", Service: "db", Instance: "db-older", Conns: 1, Until: now.Add(-10 * time.Second)},
		}}
	if err := s.PutGatewayObservation(ctx, obs); err != nil {
		t.Fatal(err)
	}

	f, err := status.ReadFleet(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	f.WriteText(&b)
	text := b.String()
	for _, want := range []string{
		"LAYER 4  ENTRY POINTS                          OPEN  CONN/S  IN B/S  OUT B/S  CONNECTIONS  CONNECT ERRORS  REFUSED\n",
		"shop/db  tcp/5432 udp/5353 tls/db.example.com  7     150.0   1500    3000     450          6               5\n",
		"    conflict: tcp/6379: other/cache over shop/cache\n",
		"    port udp/5353 of shop/db not open for 2m0s: listen udp 127.0.0.2:5353: bind: address already in use\n",
		"    draining 3 connections of shop/db to db-old for up to 20s more\n",
		"    draining 1 connections of shop/db to db-older past its deadline by 10s\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("fleet status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "shop/web  tcp") || strings.Contains(text, "REQ/S") {
		t.Errorf("an HTTP-only service in the layer-4 table, or a service without requests in the HTTP one:\n%s", text)
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Namespaces []struct {
			Namespace string                                `json:"namespace"`
			Layer4    map[string]status.L4Entries           `json:"layer4"`
			Traffic   map[string]store.ServiceTrafficStatus `json:"traffic"`
		} `json:"namespaces"`
		Gateways []struct {
			Gateway    string              `json:"gateway"`
			L4Errors   []store.L4PortError `json:"l4_errors"`
			L4Draining []store.L4Drain     `json:"l4_draining"`
			Conflicts  []string            `json:"conflicts"`
		} `json:"gateways"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Namespaces) != 1 || len(back.Gateways) != 1 {
		t.Fatalf("JSON: %s", data)
	}
	ns, gw := back.Namespaces[0], back.Gateways[0]
	if e := ns.Layer4["db"]; !slices.Equal(e.Entries, []string{"tcp/5432", "udp/5353", "tls/db.example.com"}) ||
		time.Duration(e.DrainTimeout) != 45*time.Second || len(ns.Layer4) != 1 {
		t.Errorf("layer-4 entries in the JSON: %+v", ns.Layer4)
	}
	if got := ns.Traffic["db"].L4; got == nil || *got != *l4 || ns.Traffic["db"].Gateways["gw1"].L4 == nil {
		t.Errorf("layer-4 figures in the JSON: %+v", ns.Traffic["db"])
	}
	if len(gw.L4Errors) != 1 || gw.L4Errors[0].Port != "udp/5353" || len(gw.L4Draining) != 2 || gw.L4Draining[0].Conns != 3 || len(gw.Conflicts) != 1 {
		t.Errorf("the gateway in the JSON: %+v", gw)
	}

	// Deploy status: the connections follow each traffic line.
	d := status.Deploys{{Namespace: "shop", Latest: &store.DeployStatus{DeployID: "d1", Revision: 1, Phase: "final_commit"}, Traffic: map[string]store.ServiceTrafficStatus{"db": {TrafficFigures: store.TrafficFigures{L4: l4},
		Gateways: map[string]store.TrafficFigures{"gw1": {L4: l4}}}}}}
	b.Reset()
	d.WriteText(&b)
	line := "layer 4: 150.0 conn/s, 7 open, 450 connections, 1500 B/s in, 3000 B/s out, 6 connect errors, 5 refused\n"
	if !strings.Contains(b.String(), "  traffic:   db: 0.0 req/s, 0.00% 5xx, p50 -, p99 -, 0 open, 0 requests; "+line) ||
		!strings.Contains(b.String(), "             via gw1: 0.0 req/s, 0.00% 5xx, p50 -, p99 -, 0 open, 0 requests; "+line) {
		t.Errorf("deploy status:\n%s", b.String())
	}
}
