package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

var helloBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agent-test-")
	if err != nil {
		panic(err)
	}
	helloBin = filepath.Join(dir, "hello")
	if out, err := exec.Command("go", "build", "-o", helloBin, "../../examples/hello").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building hello: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type fixture struct {
	srv   *storetest.Server
	agent *Agent
	stop  context.CancelFunc
	done  chan struct{}
	dir   string
}

// startAgent starts machine m1's agent in dir, with the control plane's
// routing republish service answering it.
func startAgent(t *testing.T, srv *storetest.Server, dir string) *fixture {
	t.Helper()
	serveRepublish(t, srv)
	return startAgentAlone(t, srv, dir)
}

// serveRepublish answers routing republish requests, as `control server` does.
func serveRepublish(t *testing.T, srv *storetest.Server) {
	t.Helper()
	stop, err := routing.ServeRepublish(context.Background(), srv.Store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// startAgentAlone starts the agent without anything answering its routing
// republish requests.
func startAgentAlone(t *testing.T, srv *storetest.Server, dir string, opts ...func(*Config)) *fixture {
	t.Helper()
	cfg := Config{
		Store: srv.Connect(t), Machine: store.MachineRecord{ID: "m1", Address: "127.0.0.1", State: store.MachineActive},
		DataDir: dir, Driver: &runtime.Process{PollInterval: 20 * time.Millisecond}, StopGrace: time.Second,
		RepublishRetry: 100 * time.Millisecond, RestartBackoff: 100 * time.Millisecond, RestartBackoffMax: 800 * time.Millisecond,
	}
	for _, o := range opts {
		o(&cfg)
	}
	// The machine is a member, as admission records it: its instances
	// are routed at its address.
	if _, err := storetest.AdmitMachine(context.Background(), srv.Store, cfg.Machine.ID, cfg.Machine.Address); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{srv: srv, agent: a, stop: cancel, done: make(chan struct{}), dir: dir}
	go func() {
		defer close(f.done)
		_ = a.Run(ctx)
	}()
	storetest.Eventually(t, 5*time.Second, "agent to answer", func() bool {
		return srv.Store.Call(context.Background(), "m1", store.CmdCapacity, nil, nil) == nil
	})
	t.Cleanup(func() {
		cancel()
		<-f.done
		for _, inst := range a.instances {
			if inst.handle != nil { // nil: waiting for its restart
				_ = a.cfg.Driver.Stop(context.Background(), inst.handle, time.Second)
			}
		}
	})
	return f
}

// commitOne records a live commit with one slot for instance id of web, the
// way the orchestrator would, so routing can be derived.
func commitOne(t *testing.T, s *store.Store, id string) {
	t.Helper()
	c := &store.DeployCommit{ID: "d1", Namespace: "shop", Kind: store.CommitFinal, Revision: 1,
		Manifest: store.Manifest{Namespace: "shop", Services: map[string]store.ServiceSpec{"web": {Command: []string{helloBin}}}},
		Slots:    []store.SlotAssignment{{Service: "web", Slot: 0, InstanceID: id, Machine: "m1", Revision: 1}}}
	if _, err := s.AppendCommit(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func startReady(t *testing.T, s *store.Store, id string, env map[string]string) store.InstanceRecord {
	t.Helper()
	return startReadySpec(t, s, id, store.ServiceSpec{Command: []string{helloBin}, Env: env, Readiness: store.Readiness{Path: "/healthz"}})
}

func startReadySpec(t *testing.T, s *store.Store, id string, spec store.ServiceSpec) store.InstanceRecord {
	t.Helper()
	ctx := context.Background()
	req := store.StartRequest{
		Instance: store.InstanceRecord{ID: id, Namespace: "shop", Service: "web", Slot: 0, Revision: 1, DeployID: "d1"},
		Spec:     spec,
	}
	var rep store.StartReply
	if err := s.Call(ctx, "m1", store.CmdStartCandidate, req, &rep); err != nil {
		t.Fatal(err)
	}
	var ready store.ReadinessReply
	if err := s.Call(ctx, "m1", store.CmdReadiness, store.ReadinessRequest{InstanceID: id, Namespace: "shop", Timeout: store.Duration(5 * time.Second)}, &ready); err != nil {
		t.Fatal(err)
	}
	if !ready.Ready {
		t.Fatalf("not ready: %s", ready.Error)
	}
	return ready.Instance
}

func answers(rec store.InstanceRecord) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s:%d/", rec.Address, rec.Port))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// helloSpec is hello with a readiness path and restart policy.
func helloSpec(restart string) store.ServiceSpec {
	return store.ServiceSpec{Command: []string{helloBin}, Readiness: store.Readiness{Path: "/healthz"}, Restart: restart}
}

func TestCrashedInstanceLeavesThePool(t *testing.T) {
	srv := storetest.Start(t)
	startAgent(t, srv, t.TempDir())
	ctx := context.Background()
	commitOne(t, srv.Store, "web-0-a")
	rec := startReadySpec(t, srv.Store, "web-0-a", helloSpec(store.RestartNever))
	head := func() uint64 {
		info, _ := srv.Store.RoutingInfo(ctx)
		return info.State.LastSeq
	}
	before := head()
	if err := killPID(rec.PID); err != nil {
		t.Fatal(err)
	}
	var got store.InstanceRecord
	storetest.Eventually(t, 5*time.Second, "the crash to be recorded", func() bool {
		_, err := readInstance(ctx, srv.Store, rec.Key(), &got)
		return err == nil && got.State == store.InstanceFailed
	})
	if got.Error == "" {
		t.Fatal("failed instance without its error")
	}
	storetest.Eventually(t, 5*time.Second, "a routing upsert without the instance", func() bool { return head() > before })
	if ev := lastWebEvent(t, srv.Store); len(ev.Endpoints) != 0 {
		t.Fatalf("routing after the crash still has endpoints: %+v", ev)
	}
}

// lastWebEvent reads the newest routing event of shop/web.
func lastWebEvent(t *testing.T, s *store.Store) store.RoutingEvent {
	t.Helper()
	msg, err := storetest.Stream(t, s, s.Names.RoutingEventsStream()).GetLastMsgForSubject(context.Background(), s.Names.RoutingServiceSubject("shop", "web"))
	if err != nil {
		t.Fatal(err)
	}
	var ev store.RoutingEvent
	if err := store.Decode("event", msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

// With no control server answering, a crashed instance's routing republish
// is not lost, not even across an agent restart: the agent asks again until
// one answers.
func TestRepublishWaitsForTheControlPlane(t *testing.T) {
	srv := storetest.Start(t)
	f := startAgentAlone(t, srv, t.TempDir())
	ctx := context.Background()
	commitOne(t, srv.Store, "web-0-a")
	rec := startReadySpec(t, srv.Store, "web-0-a", helloSpec(store.RestartNever))
	info, err := srv.Store.RoutingInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.LastSeq
	if err := killPID(rec.PID); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, 5*time.Second, "the crash to be recorded", func() bool {
		var got store.InstanceRecord
		_, err := readInstance(ctx, srv.Store, rec.Key(), &got)
		return err == nil && got.State == store.InstanceFailed
	})
	// The request went unanswered and is kept; nothing reached routing.
	storetest.Eventually(t, 5*time.Second, "the republish to be pending", func() bool {
		return slices.Contains(f.agent.republish.list(), serviceRef{"shop", "web"})
	})
	if info, _ := srv.Store.RoutingInfo(ctx); info.State.LastSeq != before {
		t.Fatalf("routing moved without a control plane: %d -> %d", before, info.State.LastSeq)
	}
	// The agent restarts meanwhile: the pending request survives in its
	// data dir.
	f.stop()
	<-f.done
	f = startAgentAlone(t, srv, f.dir)
	if !slices.Contains(f.agent.republish.list(), serviceRef{"shop", "web"}) {
		t.Fatal("the restarted agent forgot the pending republish")
	}
	serveRepublish(t, srv)
	storetest.Eventually(t, 5*time.Second, "the republish after the control plane came", func() bool {
		info, err := srv.Store.RoutingInfo(ctx)
		return err == nil && info.State.LastSeq > before
	})
	storetest.Eventually(t, 5*time.Second, "the pending record to go", func() bool {
		_, err := os.Stat(filepath.Join(f.dir, "republish-pending.json"))
		return os.IsNotExist(err)
	})
	if ev := lastWebEvent(t, srv.Store); len(ev.Endpoints) != 0 {
		t.Fatalf("routing after the crash still has endpoints: %+v", ev)
	}
}

func TestLeasedCommandsGuardGenerations(t *testing.T) {
	srv := storetest.Start(t)
	startAgent(t, srv, t.TempDir())
	ctx := context.Background()
	commitOne(t, srv.Store, "web-0-a")
	rec := startReady(t, srv.Store, "web-0-a", nil)

	var rep store.LeasedReply
	if err := srv.Store.Call(ctx, "m1", store.CmdRestart, store.LeasedCommand{InstanceID: rec.ID, Namespace: "shop", Service: "web", Attempt: 5}, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Done || rep.Attempt != 5 {
		t.Fatalf("restart reply %+v", rep)
	}
	after := record(t, srv.Store, rec)
	if after.PID == rec.PID || after.Port != rec.Port || after.State != store.InstanceReady || !answers(after) {
		t.Fatalf("restart: before %+v after %+v", rec, after)
	}
	// An older attempt is a stale completion: refused, nothing done.
	err := srv.Store.Call(ctx, "m1", store.CmdStop, store.LeasedCommand{InstanceID: rec.ID, Namespace: "shop", Service: "web", Attempt: 4}, nil)
	if !store.HasCode(err, store.CodeStale) {
		t.Fatalf("stale attempt: %v", err)
	}
	if !answers(after) {
		t.Fatal("a stale stop stopped the instance")
	}
	if err := srv.Store.Call(ctx, "m1", store.CmdStop, store.LeasedCommand{InstanceID: rec.ID, Namespace: "shop", Service: "web", Attempt: 6}, nil); err != nil {
		t.Fatal(err)
	}
	if answers(after) {
		t.Fatal("stop did not stop the instance")
	}
	// force_cleanup removes a service's instances and their records.
	startReady(t, srv.Store, "web-0-b", nil)
	if err := srv.Store.Call(ctx, "m1", store.CmdForceCleanup, store.LeasedCommand{Namespace: "shop", Service: "web", Attempt: 1}, &rep); err != nil {
		t.Fatal(err)
	}
	if _, err := readInstance(ctx, srv.Store, store.InstanceKey("shop", "m1", "web-0-b"), &after); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("force_cleanup left the record: %v", err)
	}
}

func TestBadRequestsAreStructured(t *testing.T) {
	srv := storetest.Start(t)
	startAgent(t, srv, t.TempDir())
	ctx := context.Background()
	for _, tc := range []struct {
		cmd  string
		req  any
		code string
	}{
		{"no.such.command", nil, store.CodeInvalid},
		{store.CmdStartCandidate, map[string]any{"instance": "not an object"}, store.CodeInvalid},
		{store.CmdStartCandidate, store.StartRequest{}, store.CodeInvalid},
		{store.CmdReadiness, store.ReadinessRequest{InstanceID: "ghost", Namespace: "shop"}, store.CodeNotFound},
		{store.CmdDrainInstance, store.InstanceRequest{InstanceID: "ghost", Namespace: "shop"}, store.CodeNotFound},
		{store.CmdRestart, store.LeasedCommand{InstanceID: "ghost", Namespace: "shop", Attempt: 1}, store.CodeNotFound},
	} {
		if err := srv.Store.Call(ctx, "m1", tc.cmd, tc.req, nil); !store.HasCode(err, tc.code) {
			t.Errorf("%s: got %v, want %s", tc.cmd, err, tc.code)
		}
	}
	// A start whose command cannot run fails clearly and leaves nothing.
	err := srv.Store.Call(ctx, "m1", store.CmdStartCandidate, store.StartRequest{
		Instance: store.InstanceRecord{ID: "bad-0", Namespace: "shop", Service: "web"},
		Spec:     store.ServiceSpec{Command: []string{"/nonexistent/binary"}},
	}, nil)
	if err == nil {
		t.Fatal("start of a missing binary succeeded")
	}
	var rec store.InstanceRecord
	if _, err := readInstance(ctx, srv.Store, store.InstanceKey("shop", "m1", "bad-0"), &rec); !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("failed start left a record: %v", err)
	}
}

func TestAdoptAfterRestartAndGoneInstance(t *testing.T) {
	srv := storetest.Start(t)
	dir := t.TempDir()
	f := startAgent(t, srv, dir)
	ctx := context.Background()
	commitOne(t, srv.Store, "web-0-a")
	rec := startReady(t, srv.Store, "web-0-a", nil)
	f.stop()
	<-f.done
	if !answers(rec) {
		t.Fatal("instance died with its agent")
	}
	g := startAgent(t, srv, dir)
	if g.agent.count() != 1 {
		t.Fatalf("adopted %d instances", g.agent.count())
	}
	// Stopping the adopted instance works through the new agent.
	if err := srv.Store.Call(ctx, "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: rec.ID, Namespace: "shop", Forget: true}, nil); err != nil {
		t.Fatal(err)
	}
	if answers(rec) {
		t.Fatal("adopted instance still answers after stop")
	}
}

// A running instance's states go to the machine's observations, not its
// record: the record stays what the start wrote until the stop, and a
// reader sees the newer of the two.
func TestInstanceStatesGoToObservations(t *testing.T) {
	srv := storetest.Start(t)
	ctx := context.Background()
	// Every reader reads observations, as a control server of this
	// release says once none older is heard from (readers.go).
	if _, err := srv.Store.RaiseFloor(ctx, store.GenerationObserved, "test"); err != nil {
		t.Fatal(err)
	}
	startAgent(t, srv, t.TempDir())
	ids := []string{"web-0-a", "web-0-b", "web-0-c"}
	recs := make([]store.InstanceRecord, len(ids))
	for i, id := range ids {
		recs[i] = startReady(t, srv.Store, id, nil)
	}
	var obs store.MachineObserved
	if _, err := store.GetJSON(ctx, storetest.Bucket(t, srv.Store, srv.Store.Names.ObservedBucket()), "m1", &obs); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		stored, _, err := srv.Store.GetInstance(ctx, rec.Key())
		if err != nil {
			t.Fatal(err)
		}
		if stored.State != store.InstanceStarting {
			t.Errorf("%s: record says %s, want the start's %s", rec.ID, stored.State, store.InstanceStarting)
		}
		if o := obs.Instances[rec.ID]; o.State != store.InstanceReady {
			t.Errorf("%s: observed %+v, want ready", rec.ID, o)
		}
		if got := record(t, srv.Store, rec); got.State != store.InstanceReady || got.PID != rec.PID {
			t.Errorf("%s: read as %s (pid %d), want ready (pid %d)", rec.ID, got.State, got.PID, rec.PID)
		}
	}
	if err := srv.Store.Call(ctx, "m1", store.CmdStopInstance, store.InstanceRequest{InstanceID: ids[0], Namespace: "shop"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := record(t, srv.Store, recs[0]); got.State != store.InstanceStopped {
		t.Fatalf("after the stop: read as %s, want stopped", got.State)
	}
}

// readInstance reads the instance record under key into into, as the
// store keeps it (not_found when there is none).
func readInstance(ctx context.Context, s *store.Store, key string, into *store.InstanceRecord) (uint64, error) {
	rec, rev, err := s.GetInstance(ctx, key)
	if err == nil {
		*into = *rec
	}
	return rev, err
}
