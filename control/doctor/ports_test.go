package doctor_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// Doctor on gateway ports, in the hosts layer: a port a live commit
// exposes that nobody owns, or another namespace owns, and a claim nobody
// exposes any more are problems; an exposed port its namespace owns is
// none.
func TestDoctorPorts(t *testing.T) {
	srv := storetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := srv.Store
	l4 := func(ports ...int) store.Layer4 {
		var l store.Layer4
		for _, p := range ports {
			l.TCP = append(l.TCP, store.L4Port{Port: p})
		}
		return l
	}
	for _, c := range []*store.DeployCommit{
		{ID: "d1", Namespace: "data", Kind: store.CommitFinal, Revision: 1, Manifest: store.Manifest{Namespace: "data",
			Services: map[string]store.ServiceSpec{"db": {Command: []string{"db"}, Layer4: l4(5432, 5433, 5434)}}}},
		{ID: "d2", Namespace: "misc", Kind: store.CommitFinal, Revision: 1, Manifest: store.Manifest{Namespace: "misc",
			Services: map[string]store.ServiceSpec{"x": {Command: []string{"x"}}}}},
	} {
		if _, err := s.AppendCommit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	for _, c := range []store.PortClaim{
		{Proto: "tcp", Port: 5432, Namespace: "data", Service: "db", At: now}, // as it should be
		{Proto: "tcp", Port: 5433, Namespace: "misc", Service: "x", At: now},  // someone else's
		{Proto: "udp", Port: 53, Namespace: "misc", Service: "x", At: now},    // exposed by nobody
	} {
		if err := s.PutPortClaim(ctx, &c); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := doctor.Run(ctx, s, doctor.Options{ProbeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range rep.Findings {
		if f.Layer == doctor.LayerHosts {
			got[f.Subject] = f.Severity + " " + f.Message
		}
	}
	want := map[string]string{
		"tcp/5433": "problem exposed by data/db but owned by misc",
		"tcp/5434": "problem exposed by data/db but owned by nobody: another namespace could claim it (restart `control server` to claim it)",
		"udp/53":   "problem owned by misc (service x), which no longer exposes it: nobody else can expose it until released",
	}
	if len(got) != len(want) {
		t.Fatalf("hosts findings %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if rep.Checked[doctor.LayerHosts] != 3 {
		t.Errorf("checked %v", rep.Checked)
	}
}
