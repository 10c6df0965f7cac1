// Package rollout moves the fleet's agents onto a release: canary machines
// first, then batches, never more than a set number mid-upgrade at once,
// stopping at the first machine whose upgrade fails. Each machine does its
// own upgrade (a leased command to its agent, control/agent and
// internal/upgrade on the machine: verify, swap, restart, health gate,
// rollback by itself); the rollout tells them, in order, and reads the
// outcome each reports in its machine state. Before it tells any, it
// refuses a release the skew policy does not allow (skew.go): ahead of
// the control plane, or skipping a minor release.
package rollout

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// LockKey is the lease a rollout holds: one at a time per authority.
const LockKey = "cp.lock.fleet_upgrade"

// Options say what to roll out and how.
type Options struct {
	Release string
	// Canary machines are upgraded first, one after another; 0 means none.
	Canary int
	// Batch is how many machines a batch after the canaries holds
	// (default: a tenth of the machines to upgrade, at least 1).
	Batch int
	// MaxUnavailable bounds machines mid-upgrade at once (default 1).
	MaxUnavailable int
	// HealthBound is what each machine's new release has to pass its
	// health gate in (default 60s).
	HealthBound time.Duration
	// ReportSlack is how much longer than HealthBound a machine has to
	// report the outcome before the rollout calls it failed (default 20s).
	ReportSlack time.Duration
	// RPCTimeout bounds the upgrade request (download and verification
	// included; default 2m).
	RPCTimeout     time.Duration
	AllowDowngrade bool
	// Machines limits the rollout to these machines (default: all).
	Machines []string
	// Progress, if set, is told every step.
	Progress func(Step)
}

// Step is one machine's progress.
type Step struct {
	Machine string        `json:"machine"`
	Phase   string        `json:"phase"` // canary, batch N
	State   string        `json:"state"` // upgrading, upgraded, current, failed, skipped
	Detail  string        `json:"detail,omitempty"`
	Took    time.Duration `json:"took,omitempty"`
}

// Step states.
const (
	StepUpgrading = "upgrading"
	StepUpgraded  = "upgraded"
	StepCurrent   = "current"
	StepFailed    = "failed"
	StepSkipped   = "skipped"
)

// Result is a rollout's outcome.
type Result struct {
	Rollout  string   `json:"rollout"`
	Release  string   `json:"release"`
	Upgraded []string `json:"upgraded"`
	Current  []string `json:"current"`
	// Skipped machines were not asked (offline, no release for their
	// architecture), with why.
	Skipped map[string]string `json:"skipped"`
	// Failed is the machine that stopped the rollout; Untouched the
	// machines it did not reach.
	Failed    *Step    `json:"failed,omitempty"`
	Untouched []string `json:"untouched,omitempty"`
	Took      string   `json:"took"`
}

// Run rolls o.Release out. It returns the result and, when a machine
// failed, an upgrade_failed error naming it and why.
func Run(ctx context.Context, s *store.Store, o Options) (*Result, error) {
	start := time.Now()
	if _, err := version.Parse(o.Release); err != nil {
		return nil, store.Errorf(store.CodeInvalid, "%v", err)
	}
	if o.MaxUnavailable <= 0 {
		o.MaxUnavailable = 1
	}
	if o.HealthBound <= 0 {
		o.HealthBound = 60 * time.Second
	}
	if o.ReportSlack <= 0 {
		o.ReportSlack = 20 * time.Second
	}
	if o.RPCTimeout <= 0 {
		o.RPCTimeout = 2 * time.Minute
	}
	if o.Canary < 0 || o.Batch < 0 {
		return nil, store.Errorf(store.CodeInvalid, "--canary and --batch cannot be negative")
	}
	// Each machine is told to upgrade by a signed order (a downgrade's
	// permission included): without a key, every one would be refused.
	if err := s.CanOrder("a fleet upgrade"); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	lease, err := s.AcquireLease(ctx, LockKey, store.LeaseOptions{TTL: 30 * time.Second, Holder: host, Purpose: "fleet upgrade to " + o.Release, KeepAlive: true})
	if err != nil {
		return nil, err
	}
	defer lease.Release(context.Background())

	list, err := machines.List(ctx, s, false, 0)
	if err != nil {
		return nil, err
	}
	only, unknown := map[string]bool{}, map[string]bool{}
	for _, m := range o.Machines {
		only[m], unknown[m] = true, true
	}
	res := &Result{Rollout: fmt.Sprintf("%s-%d", o.Release, start.UnixMilli()), Release: o.Release, Skipped: map[string]string{},
		Upgraded: []string{}, Current: []string{}}
	releases := map[string]error{}
	var targets []string
	// from is each target's release, for the skew policy (skew.go).
	from := map[string]string{}
	for _, m := range list {
		if len(only) > 0 && !only[m.ID] {
			continue
		}
		delete(unknown, m.ID)
		skip := func(why string) {
			res.Skipped[m.ID] = why
			o.progress(Step{Machine: m.ID, State: StepSkipped, Detail: why})
		}
		switch {
		case m.Liveness != store.MachineFresh:
			skip("machine is " + m.Liveness)
			continue
		case m.Release == o.Release:
			res.Current = append(res.Current, m.ID)
			continue
		case m.Arch == "":
			skip("its agent does not report its architecture (a release older than fleet upgrades): upgrade it by hand")
			continue
		case version.Older(o.Release, m.Release) && !o.AllowDowngrade:
			skip(fmt.Sprintf("runs %s, newer than %s (--allow-downgrade)", m.Release, o.Release))
			continue
		}
		rerr, seen := releases[m.Arch]
		if !seen {
			_, rerr = s.Release(ctx, o.Release, m.Arch)
			releases[m.Arch] = rerr
		}
		if rerr != nil {
			if !store.HasCode(rerr, store.CodeNotFound) {
				return nil, rerr
			}
			skip(fmt.Sprintf("no release %s for %s", o.Release, m.Arch))
			continue
		}
		targets = append(targets, m.ID)
		from[m.ID] = m.Release
	}
	for m := range unknown {
		return nil, store.Errorf(store.CodeNotFound, "no machine %s", m).With("machine", m)
	}
	if len(targets) == 0 && len(res.Current) == 0 {
		return nil, store.Errorf(store.CodeNotFound, "no machine to upgrade to %s", o.Release)
	}
	if err := checkSkew(ctx, s, o.Release, from); err != nil {
		return nil, err
	}

	rec := &recorder{s: s, rec: store.RolloutRecord{ID: res.Rollout, Release: o.Release, Holder: host, State: store.RolloutRunning,
		Total: len(targets) + len(res.Current), Current: len(res.Current), Skipped: len(res.Skipped), Started: start.UTC()}}
	rec.write(ctx, true)
	progress := o.Progress
	o.Progress = func(st Step) {
		rec.update(ctx, func(r *store.RolloutRecord) {
			r.Phase = st.Phase
			switch st.State {
			case StepUpgraded:
				r.Upgraded++
			case StepCurrent:
				r.Current++
			}
		})
		if progress != nil {
			progress(st)
		}
	}

	phases := plan(targets, o.Canary, o.Batch)
	for i, ph := range phases {
		failed := runPhase(ctx, s, o, res, ph)
		if failed != nil {
			res.Failed = failed
			for _, rest := range phases[i+1:] {
				res.Untouched = append(res.Untouched, rest.machines...)
			}
			break
		}
	}
	sort.Strings(res.Upgraded)
	res.Took = time.Since(start).Round(time.Millisecond).String()
	rec.mu.Lock()
	rec.rec.State, rec.rec.Phase = store.RolloutDone, ""
	if res.Failed != nil {
		rec.rec.State, rec.rec.FailedMachine, rec.rec.Reason = store.RolloutFailed, res.Failed.Machine, res.Failed.Detail
	}
	rec.mu.Unlock()
	rec.write(context.WithoutCancel(ctx), true)
	if res.Failed != nil {
		return res, store.Errorf(store.CodeUpgradeFailed, "machine %s: %s; the rollout stopped (%d upgraded, %d untouched)",
			res.Failed.Machine, res.Failed.Detail, len(res.Upgraded), len(res.Untouched)).
			With("machine", res.Failed.Machine).With("reason", res.Failed.Detail)
	}
	return res, nil
}

func (o Options) progress(st Step) {
	if o.Progress != nil {
		o.Progress(st)
	}
}

type phase struct {
	name     string
	machines []string
	// sequential: canaries go one at a time.
	sequential bool
}

// plan splits targets into the canary phase and batches.
func plan(targets []string, canary, batch int) []phase {
	var out []phase
	if canary > 0 {
		n := min(canary, len(targets))
		out = append(out, phase{name: "canary", machines: targets[:n], sequential: true})
		targets = targets[n:]
	}
	if batch <= 0 {
		batch = max(1, (len(targets)+9)/10)
	}
	for i := 0; len(targets) > 0; i++ {
		n := min(batch, len(targets))
		out = append(out, phase{name: fmt.Sprintf("batch %d", i+1), machines: targets[:n]})
		targets = targets[n:]
	}
	return out
}

// runPhase upgrades a phase's machines, at most MaxUnavailable at once,
// and returns the first failure. Once one fails no other machine of the
// phase is started; those under way finish.
func runPhase(ctx context.Context, s *store.Store, o Options, res *Result, ph phase) *Step {
	par := o.MaxUnavailable
	if ph.sequential {
		par = 1
	}
	sem := make(chan struct{}, par)
	var (
		mu     sync.Mutex
		failed *Step
		wg     sync.WaitGroup
	)
	for _, m := range ph.machines {
		sem <- struct{}{}
		mu.Lock()
		stop := failed != nil
		if stop {
			res.Untouched = append(res.Untouched, m)
		}
		mu.Unlock()
		if stop || ctx.Err() != nil {
			<-sem
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st := upgradeOne(ctx, s, o, res.Rollout, ph.name, m)
			mu.Lock()
			defer mu.Unlock()
			switch st.State {
			case StepUpgraded:
				res.Upgraded = append(res.Upgraded, m)
			case StepCurrent:
				res.Current = append(res.Current, m)
			default:
				if failed == nil {
					failed = &st
				}
			}
		}()
	}
	wg.Wait()
	return failed
}

// upgradeOne tells machine m to upgrade and waits for the outcome its
// agent reports.
func upgradeOne(ctx context.Context, s *store.Store, o Options, rollout, phaseName, m string) Step {
	start := time.Now()
	o.progress(Step{Machine: m, Phase: phaseName, State: StepUpgrading})
	done := func(state, detail string) Step {
		st := Step{Machine: m, Phase: phaseName, State: state, Detail: detail, Took: time.Since(start).Round(time.Millisecond)}
		o.progress(st)
		return st
	}
	attempt := int(time.Now().UnixMilli())
	req := store.UpgradeRequest{Release: o.Release, Rollout: rollout, Attempt: attempt, AllowDowngrade: o.AllowDowngrade, HealthBound: store.Duration(o.HealthBound)}
	cctx, cancel := context.WithTimeout(ctx, o.RPCTimeout)
	var rep store.UpgradeReply
	err := s.Call(cctx, m, store.CmdUpgrade, req, &rep)
	cancel()
	if err != nil {
		return done(StepFailed, "upgrade refused: "+err.Error())
	}
	if !rep.Restarting {
		return done(StepCurrent, rep.Detail)
	}
	// The outcome comes in the machine's state, written by the new
	// release once its health gate passed, or by the previous one after
	// it rolled back.
	deadline := time.Now().Add(o.HealthBound + o.ReportSlack)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if st, err := s.MachineStateOf(ctx, m); err == nil && st.Upgrade != nil && st.Upgrade.Attempt == attempt {
			switch st.Upgrade.State {
			case upgrade.StateConfirmed:
				if st.Release == o.Release {
					return done(StepUpgraded, fmt.Sprintf("%s → %s", rep.From, o.Release))
				}
			case upgrade.StateRolledBack:
				return done(StepFailed, "rolled back to "+st.Upgrade.From+": "+st.Upgrade.Reason)
			}
		}
		if time.Now().After(deadline) {
			return done(StepFailed, fmt.Sprintf("no outcome reported within %s of the upgrade request (health bound %s)", o.HealthBound+o.ReportSlack, o.HealthBound))
		}
		select {
		case <-ctx.Done():
			return done(StepFailed, "interrupted: "+ctx.Err().Error())
		case <-tick.C:
		}
	}
}

// recorder keeps a rollout's record in the store: at most every
// recordEvery while it runs, and at its start and end.
type recorder struct {
	s    *store.Store
	mu   sync.Mutex
	rec  store.RolloutRecord
	last time.Time
}

const recordEvery = 500 * time.Millisecond

func (r *recorder) update(ctx context.Context, f func(*store.RolloutRecord)) {
	r.mu.Lock()
	f(&r.rec)
	due := time.Since(r.last) >= recordEvery
	r.mu.Unlock()
	if due {
		r.write(ctx, false)
	}
}

// write stores the record. It is an account for people, so a failed write
// does not stop the rollout; the next one carries the progress.
func (r *recorder) write(ctx context.Context, force bool) {
	r.mu.Lock()
	if !force && time.Since(r.last) < recordEvery {
		r.mu.Unlock()
		return
	}
	r.last = time.Now()
	rec := r.rec
	r.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = r.s.PutRollout(wctx, &rec)
}
