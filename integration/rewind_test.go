package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// served is one request through the gateway: when it was answered and by
// which instance ("" for a failure).
type served struct {
	at       time.Time
	instance string
}

// TestRewoundStoreConverges runs a fleet (control server, an agent, a
// gateway) whose store goes back in time: the server's data directory is
// copied (server stopped) at deploy v1, v2 and v3 follow, then the server
// is restarted from the copy. The gateway rebuilds from the store and never
// serves the rewound-away v3 again; the next deploy (v4) is served alone
// within 5 s of its commit; the agent reports v3's instances, which it keeps
// running, as unknown to the store, and control doctor names them.
func TestRewoundStoreConverges(t *testing.T) {
	c := newCluster(t)
	c.agentArgs = []string{"--heartbeat", "1s"}
	c.join("m1")
	gw := c.startGateway("gw1")
	deploy := func(v int, args ...string) string {
		body := strings.Replace(gwV1, `VERSION: "1"`, fmt.Sprintf(`VERSION: "%d"`, v), 1)
		return c.mustControl(append([]string{"deploy", "apply", "-f", c.manifest(fmt.Sprintf("v%d.yaml", v), body), "--drain-grace", "100ms"}, args...)...)
	}
	ids := func() []string {
		var out []string
		for _, in := range c.instances("shop") {
			if in.State == store.InstanceReady {
				out = append(out, in.ID)
			}
		}
		slices.Sort(out)
		return out
	}
	port := strings.TrimPrefix(c.url, "nats://")
	// restart restarts the server on its port after swap, and returns
	// when it was ready.
	restart := func(swap func()) time.Time {
		c.server.stop(syscall.SIGTERM)
		swap()
		c.startServer(port)
		ready := time.Now()
		c.waitReachable("m1")
		return ready
	}

	deploy(1)
	older := filepath.Join(c.dir, "server-v1")
	restart(func() {
		if out, err := exec.Command("cp", "-a", c.serverDir(), older).CombinedOutput(); err != nil {
			t.Fatalf("copying the server's data: %v: %s", err, out)
		}
	})
	deploy(2)
	deploy(3)
	v3 := ids()
	waitApplied(t, gw, routingHead(t, c))
	before, _ := gw.projection()

	// The store goes back to v1.
	swapped := time.Now()
	back := restart(func() {
		if err := os.Rename(c.serverDir(), filepath.Join(c.dir, "server-v3")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(older, c.serverDir()); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := gw.projectionFull()
		if err == nil && st.Rewinds >= 1 && st.Connected && st.AppliedSeq < before.AppliedSeq {
			t.Logf("gateway rebuilt from the rewound store %s after it was back: sequence %d, was %d",
				time.Since(back).Round(time.Millisecond), st.AppliedSeq, before.AppliedSeq)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not rebuild from the rewound store: %+v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := gw.proc.output(); !strings.Contains(out, "went back in time") {
		t.Error("the gateway did not say the store went back in time")
	}
	// The agent writes its state (and beat) again at once on reconnecting:
	// the rewound store's beat is too old for a deploy to place on m1.
	for deadline := time.Now().Add(5 * time.Second); ; {
		ms, err := c.store.MachineStateOf(context.Background(), "m1")
		if err == nil && ms.UpdatedAt.After(swapped) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not write its state to the rewound store: %+v %v", ms, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Requests from now on: none may reach v3, rewound away.
	var mu sync.Mutex
	var log []served
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			code, inst, err := gw.request("shop.example.com", "/")
			if err != nil || code != 200 {
				inst = ""
			}
			mu.Lock()
			log = append(log, served{time.Now(), inst})
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var st store.DeployStatus
	if err := json.Unmarshal([]byte(deploy(4, "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	v4 := ids()
	time.Sleep(time.Second) // served after the apply, too
	close(stop)
	wg.Wait()

	commits := storetest.Stream(t, c.store, c.store.Names.DeployCommitsStream())
	cm, err := commits.GetMsg(context.Background(), st.CommitSeq)
	if err != nil {
		t.Fatalf("reading v4's commit %d: %v", st.CommitSeq, err)
	}
	// Only v4 from the first request of the run of v4 answers that lasts
	// to the end.
	only := time.Time{}
	for i := len(log) - 1; i >= 0 && slices.Contains(v4, log[i].instance); i-- {
		only = log[i].at
	}
	failed := 0
	for _, s := range log {
		if slices.Contains(v3, s.instance) {
			t.Fatalf("the gateway served %s of v3, rewound away, at %s", s.instance, s.at.Format(time.RFC3339Nano))
		}
		if s.instance == "" {
			failed++
		}
	}
	if only.IsZero() {
		t.Fatalf("the gateway does not serve v4 alone (%v) at the end: %+v", v4, log[len(log)-1])
	}
	took := only.Sub(cm.Time)
	t.Logf("v4 committed at %s; the gateway served v4 alone %s later (%d requests, %d failed: v1's instances, which the rewound store routes, are gone)",
		cm.Time.Format(time.RFC3339Nano), took.Round(time.Millisecond), len(log), failed)
	if took > 5*time.Second {
		t.Errorf("the gateway served v4 alone %s after its commit, want at most 5s", took)
	}

	// The agent reports v3's instances, still running, as unknown to the
	// store; control doctor names them.
	deadline = time.Now().Add(10 * time.Second)
	for {
		ms, err := c.store.MachineStateOf(context.Background(), "m1")
		if err == nil && slices.Equal(ms.Unrecorded, v3) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not report v3's instances %v as unrecorded: %+v %v", v3, ms, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep, code, _ := doctorRun(t, c, gw)
	if code == 0 {
		t.Error("doctor exited 0 with instances the store does not know")
	}
	for _, id := range v3 {
		wantFinding(t, rep, doctor.LayerMachines, `runs instance `+regexp.QuoteMeta(id)+` \(shop/web\) that has no record: .*gone back in time.*control instance stop `+regexp.QuoteMeta(id)+` --machine m1`)
	}

	// The operator's call: stopped, they are gone from the report.
	for _, id := range v3 {
		c.mustControl("instance", "stop", id, "--machine", "m1", "--stop-grace", "1s")
	}
	rep, _, out := doctorRun(t, c, gw)
	for _, f := range rep.Findings {
		if f.Layer == doctor.LayerMachines && f.Severity == doctor.Problem {
			t.Errorf("doctor after the strays were stopped: %s", out)
			break
		}
	}
}
