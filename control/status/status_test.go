package status

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// A fleet of many machines behind stays readable: the text names the
// first ten and counts the rest, and the traffic table shows only when a
// gateway reported some.
func TestTextNamesTenMachinesAndCountsTheRest(t *testing.T) {
	behind := map[string]store.Counts{}
	for i := range 12 {
		behind[fmt.Sprintf("m%02d", i)] = store.Counts{Ready: 1, Starting: 1}
	}
	behind["m99"] = store.Counts{Ready: 2}
	d := Deploys{{Namespace: "shop", Latest: &store.DeployStatus{DeployID: "d1", Revision: 3, Phase: "final_commit"}, Machines: behind}}
	var b bytes.Buffer
	d.WriteText(&b)
	text := b.String()
	for _, want := range []string{
		"namespace shop\n  live:      none\n  latest:    d1 revision 3",
		"  machines:  13, 1 with all instances ready\n",
		"             m09 (1 of 2 ready)\n             and 2 more\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("deploy status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "m10 (") || strings.Contains(text, "traffic:") {
		t.Errorf("deploy status names an eleventh machine or traffic nobody reported:\n%s", text)
	}

	f := &Fleet{Namespaces: []Namespace{{Namespace: "shop", Revision: 3, Deploy: "d1"}}, Machines: Machines{Total: 12, Liveness: map[string]int{store.MachineOffline: 12}}}
	for i := range 12 {
		f.Machines.NotFresh = append(f.Machines.NotFresh, fmt.Sprintf("m%02d (offline)", i))
	}
	b.Reset()
	f.WriteText(&b)
	text = b.String()
	if !strings.Contains(text, "machines: 12 (0 fresh, 0 stale, 12 offline, 0 never seen)\n") || !strings.Contains(text, "  m09 (offline)\n  and 2 more\n") {
		t.Errorf("fleet status:\n%s", text)
	}
	if strings.Contains(text, "REQ/S") {
		t.Errorf("a traffic table without traffic:\n%s", text)
	}
	f.Namespaces[0].Traffic = map[string]store.ServiceTrafficStatus{"web": {TrafficFigures: store.TrafficFigures{Requests: 10, Rate: 2.5, P99: 0.0123}}}
	b.Reset()
	f.WriteText(&b)
	if !strings.Contains(b.String(), "shop/web  2.5    0.00%  -    12.3ms  0     10        0") {
		t.Errorf("traffic table:\n%s", b.String())
	}
}
