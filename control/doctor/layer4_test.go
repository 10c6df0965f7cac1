package doctor_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Doctor on layer 4: a gateway port two services expose is a routing
// problem (the claims should have kept it out), so is one a gateway
// reports as a conflict; a port a gateway cannot open and a connection it
// keeps draining past its deadline are warnings naming the gateway; a
// drain still within its deadline is no finding.
func TestDoctorLayer4(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := srv.Store
	now := time.Now().UTC()
	tcp := store.Layer4{TCP: []store.L4Port{{Port: 5432}}}
	var seq uint64
	for i, ns := range []string{"alpha", "beta"} {
		pend, err := storetest.Prepare(ctx, s, ns, map[string]storetest.Service{
			"db": {Instances: []storetest.Instance{{ID: ns + "-db", Machine: "m" + string(rune('1'+i)), Address: "127.0.0." + string(rune('1'+i)), Port: 5432}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		spec := pend.Deploy.Manifest.Services["db"]
		spec.Layer4 = tcp
		pend.Deploy.Manifest.Services["db"] = spec
		if seq, err = pend.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// alpha owns the port, as its apply would have claimed it: what is
	// left to find is beta's record the claim should have kept out.
	if err := s.PutPortClaim(ctx, &store.PortClaim{Version: store.RecordVersion, Proto: store.ProtoTCP, Port: 5432, Namespace: "alpha", Service: "db", At: now}); err != nil {
		t.Fatal(err)
	}
	obs := &store.GatewayObservation{Gateway: "gw1", AppliedSeq: seq, At: now,
		Conflicts: []string{"tcp/5432: alpha/db over beta/db"},
		L4Errors: []store.L4PortError{{Port: "tcp/5432", Namespace: "alpha", Service: "db",
			Error: "listen tcp 127.0.0.2:5432: bind: address already in use", Since: now.Add(-time.Minute)}},
		L4Draining: []store.L4Drain{
			{Namespace: "alpha", Service: "db", Instance: "alpha-db-old", Conns: 2, Until: now.Add(-30 * time.Second)},
			{Namespace: "alpha", Service: "db", Instance: "alpha-db-older", Conns: 1, Until: now.Add(20 * time.Second)},
		}}
	if err := s.PutGatewayObservation(ctx, obs); err != nil {
		t.Fatal(err)
	}

	rep, err := doctor.Run(ctx, s, doctor.Options{ProbeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ severity, layer, subject, message string }{
		{doctor.Problem, doctor.LayerGateways, "gateway gw1", "serves a gateway port or passthrough host two services expose: tcp/5432: alpha/db over beta/db"},
		{doctor.Problem, doctor.LayerRouting, "tcp/5432", "exposed by services alpha/db and beta/db; gateways serve alpha/db only"},
		{doctor.Warning, doctor.LayerGateways, "gateway gw1", "cannot open port tcp/5432 for alpha/db (since "},
		{doctor.Warning, doctor.LayerGateways, "gateway gw1", "keeps 2 layer-4 connections of alpha/db to alpha-db-old past their drain deadline ("},
	}
	var got []doctor.Finding
	for _, f := range rep.Findings {
		if strings.Contains(f.Subject+f.Message, "5432") || strings.Contains(f.Message, "drain") {
			got = append(got, f)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("layer-4 findings: %+v\nall: %+v", got, rep.Findings)
	}
	for i, w := range want {
		f := got[i]
		if f.Severity != w.severity || f.Layer != w.layer || f.Subject != w.subject || !strings.Contains(f.Message, w.message) {
			t.Errorf("finding %d = %+v, want %s %s %s %q", i, f, w.severity, w.layer, w.subject, w.message)
		}
	}
	if !strings.Contains(got[2].Message, "bind: address already in use; it retries") || !strings.Contains(got[3].Message, "30s ago") {
		t.Errorf("the warnings lack the error or how late the drain is: %+v", got[2:])
	}
	if rep.Coherent {
		t.Error("coherent with a port two services expose")
	}
	var b bytes.Buffer
	printers.Doctor(&b, rep)
	if !strings.Contains(b.String(), "warning   gateways  gateway gw1  cannot open port tcp/5432 for alpha/db") {
		t.Errorf("doctor's text:\n%s", b.String())
	}
}
