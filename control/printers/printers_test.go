package printers

import (
	"bytes"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

// A probed machine that did not answer shows the kind of failure, not the
// whole error; labels are sorted and an empty region is a dash.
func TestMachinesTable(t *testing.T) {
	list := []machines.Listed{
		{MachineRecord: store.MachineRecord{ID: "m1", Region: "eu", Labels: map[string]string{"zone": "b", "disk": "ssd"}, State: store.MachineActive, Address: "10.0.0.1"},
			Liveness: store.MachineFresh, Instances: 2, Free: 254, Reachable: true, RTT: "1ms"},
		{MachineRecord: store.MachineRecord{ID: "m2", State: store.MachineDraining, Address: "10.0.0.2"},
			Liveness: store.MachineNeverSeen, Problem: "calling m2: " + store.CauseTimeout + " after 1s"},
	}
	var b bytes.Buffer
	Machines(&b, list, true)
	want := []string{
		"MACHINE  REGION  LABELS           STATE     ADDRESS   LIVENESS  INSTANCES  FREE  REACHABLE",
		"m1       eu      disk=ssd,zone=b  active    10.0.0.1  fresh     2          254   yes (1ms)",
		"m2       -       -                draining  10.0.0.2  never     0          0     no: timeout",
	}
	got := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got\n%s", b.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i, got[i], want[i])
		}
	}
	b.Reset()
	Machines(&b, list, false)
	if strings.Contains(b.String(), "REACHABLE") {
		t.Errorf("not probed, yet a REACHABLE column:\n%s", b.String())
	}
}
