package cuts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleetsim"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// deployNS is the namespace the deploy scenarios apply to.
const deployNS = "shop"

// applyOptions are an orchestrator's on a fleet whose instances are ready
// at once and whose gateways need no waiting for: the shortest lease, so
// that the completer takes over soon after the orchestrator died with
// the box.
func applyOptions(holder string) deploy.Options {
	return deploy.Options{Holder: holder, LeaseTTL: store.MinLeaseTTL, ProbeTimeout: time.Second, RPCTimeout: 2 * time.Second,
		GatewayWait: time.Millisecond, DrainGrace: time.Millisecond, StopGrace: 100 * time.Millisecond}
}

// shopManifest is revision v of the namespace: two replicas of web,
// each v with new instances (the environment changes); with a rollout,
// a canary step of 50% held for hold.
func shopManifest(v int64, hold time.Duration) *store.Manifest {
	replicas, none := 2, 0
	m := &store.Manifest{Namespace: deployNS, Services: map[string]store.ServiceSpec{"web": {
		Command: []string{"app"}, Replicas: &replicas, Env: map[string]string{"V": fmt.Sprint(v)},
		Readiness: store.Readiness{Path: "/healthz"}, Routes: []store.Route{{Hosts: []string{"shop.example.com"}}},
	}}}
	if hold > 0 {
		m.Rollout = &store.CanarySpec{Steps: []store.CanaryStep{{Weight: 50, Hold: store.Duration(hold)}},
			Limits: store.CanaryLimits{MinRequests: &none}}
	}
	return m
}

// deployLedger is what the deploys of a run were acknowledged as: the
// commits applies reported committed (by deploy ID, at their revision)
// and the canaries an operator's promotion of was acknowledged.
type deployLedger struct {
	mu        sync.Mutex
	committed map[string]int64
	promoted  map[string]bool
	version   atomic.Int64
	applies   int
	// failed counts the applies that failed while the power was on, the
	// last error kept: what kept deploys from committing.
	failed  int
	lastErr error
}

// deploysWork applies revision after revision, as `control deploy apply`
// on the box does, until the power goes; with hold, each apply but the
// first holds a canary while an operator promotes it at a random moment.
func (l *deployLedger) work(hold time.Duration) func(ctx context.Context, s *store.Store, rng *rand.Rand, ack func(func())) {
	return func(ctx context.Context, s *store.Store, rng *rand.Rand, ack func(func())) {
		d := deploy.New(s, applyOptions("apply"))
		var wg sync.WaitGroup
		defer wg.Wait()
		if hold > 0 {
			wait := time.Duration(rng.Int64N(int64(hold) * 2))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
					if st, err := d.DecideCanary(ctx, deployNS, store.DecisionPromote); err == nil {
						ack(func() { l.mu.Lock(); l.promoted[st.DeployID] = true; l.mu.Unlock() })
					}
				}
			}()
		}
		for ctx.Err() == nil {
			st, err := d.Apply(ctx, shopManifest(l.version.Add(1), hold))
			if err != nil {
				ack(func() { l.mu.Lock(); l.failed, l.lastErr = l.failed+1, err; l.mu.Unlock() })
			}
			if store.HasCode(err, store.CodeBusy) {
				// The lease of an apply that died with the box holds
				// until its TTL; an operator tries again a little later.
				time.Sleep(50 * time.Millisecond)
			}
			// `control deploy apply` reports a deploy committed once its
			// final commit is appended, even if publishing its routing
			// failed after (the error says it is committed).
			if st != nil && st.CommitSeq > 0 {
				ack(func() { l.mu.Lock(); l.committed[st.DeployID] = st.Revision; l.applies++; l.mu.Unlock() })
			}
		}
	}
}

// check finishes what the cut left (the control server's completer, as
// it runs after a reboot), then holds the store to the ledger: every
// deploy final, every commit reported there at its revision, every
// promoted canary committed.
func (l *deployLedger) check(ctx context.Context, t *testing.T, s *store.Store, cut string) {
	t.Helper()
	d := deploy.New(s, applyOptions("control server"))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- d.RunCompleter(cctx, deploy.CompleterOptions{Interval: 50 * time.Millisecond, RetryInterval: 200 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	var open []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts, err := d.Statuses(ctx, deployNS)
		open = open[:0]
		for _, st := range sts {
			if st.State == store.DeployApplying || !st.Settled || len(st.Cleanup) > 0 {
				open = append(open, fmt.Sprintf("%s %s/%s settled=%v cleanup=%d", st.DeployID, st.State, st.Phase, st.Settled, len(st.Cleanup)))
			}
		}
		if err == nil && len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: deploys never reached a final state after the reboot (%v): %v\nhistory of their statuses:\n%s", cut, err, open, statusHistory(t, s))
		}
		time.Sleep(50 * time.Millisecond)
	}
	good, refused, err := s.CommitHistory(ctx, deployNS)
	if err != nil && !store.HasCode(err, store.CodeNotFound) {
		t.Fatalf("%s: reading the commit history: %v", cut, err)
	}
	if len(refused) > 0 {
		t.Errorf("%s: %d commits refused after the cut: %v", cut, len(refused), refused)
	}
	finals := map[string]int64{}
	var revs []int64
	for _, c := range good {
		if c.Kind == store.CommitFinal {
			finals[c.ID] = c.Revision
			revs = append(revs, c.Revision)
		}
	}
	if !slices.IsSorted(revs) || len(slices.Compact(slices.Clone(revs))) != len(revs) {
		t.Errorf("%s: final commits' revisions are not one after the other: %v", cut, revs)
	}
	sts, err := d.Statuses(ctx, deployNS)
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]store.DeployState{}
	for _, st := range sts {
		state[st.DeployID] = st.State
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, rev := range l.committed {
		if got, ok := finals[id]; !ok || got != rev {
			t.Errorf("%s: LOST: deploy %s was reported committed at revision %d; the store's final commits have it at %d (present: %v)", cut, id, rev, got, ok)
		}
		if state[id] != store.DeployCommitted {
			t.Errorf("%s: LOST: deploy %s was reported committed; its status says %q", cut, id, state[id])
		}
	}
	for id := range l.promoted {
		if state[id] != store.DeployCommitted {
			t.Errorf("%s: LOST: an operator's promotion of deploy %s's canary was acknowledged; the deploy ended %q", cut, id, state[id])
		}
	}
}

// startFleet runs simulated agents of three machines on their own
// connection to the box: other boxes, whose agents outlive its power.
func startFleet(t *testing.T, s *store.Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f, err := fleetsim.Start(ctx, s, fleetsim.Config{Machines: 3, Prefix: "edge", Beat: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); f.Stop() })
}

// Power cuts at random points of deploys on a single box: every deploy an
// apply reported committed is in the store at its revision afterwards,
// and the completer brings every deploy the cut interrupted to a final
// state.
func TestCutsDeploys(t *testing.T) {
	b := newBox(t)
	startFleet(t, connect(t, b.url(), b.ctlDir, "fleet", 1))
	l := &deployLedger{committed: map[string]int64{}, promoted: map[string]bool{}}
	b.cutPower(t, scenario{cuts: 20, window: 600 * time.Millisecond, work: l.work(0), check: l.check})
	t.Logf("%d deploys reported committed, each checked after every later cut; %d applies failed with the power on (last: %v)",
		len(l.committed), l.failed, l.lastErr)
}

// Power cuts at random points of canaries: a step started (its checkpoint
// commit, the split routing), held, promoted by an operator or passed;
// every promotion acknowledged ends in a committed deploy.
func TestCutsCanaries(t *testing.T) {
	b := newBox(t)
	startFleet(t, connect(t, b.url(), b.ctlDir, "fleet", 1))
	l := &deployLedger{committed: map[string]int64{}, promoted: map[string]bool{}}
	b.cutPower(t, scenario{cuts: 20, window: 1500 * time.Millisecond, work: l.work(400 * time.Millisecond), check: l.check})
	t.Logf("%d deploys reported committed, %d canary promotions acknowledged; %d applies failed with the power on (last: %v)",
		len(l.committed), len(l.promoted), l.failed, l.lastErr)
}

// statusHistory is the namespace's deploy statuses as the store holds
// them, each with its revision and when it was written (the bucket keeps
// the last write of each): which write left a status where it is.
func statusHistory(t *testing.T, s *store.Store) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := storetest.Bucket(t, s, s.Names.DeployStatusBucket())
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for k := range keys.Keys() {
		hist, err := kv.History(ctx, k)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", k, err)
			continue
		}
		for _, e := range hist {
			var st store.DeployStatus
			_ = json.Unmarshal(e.Value(), &st)
			fmt.Fprintf(&b, "%s rev %d %s: %s/%s settled=%v\n", k, e.Revision(), e.Created().Format("15:04:05.000"), st.State, st.Phase, st.Settled)
		}
	}
	return b.String()
}
