package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

// RestartError is what Run returns when the agent is to go on as another
// binary: a release it upgraded to, or the previous one after a failed
// trial. Its caller flushes what it holds and execs Path in this process,
// so a supervisor (systemd) sees no exit and the instances keep their
// parent.
type RestartError struct {
	Path   string
	Reason string
}

func (e *RestartError) Error() string { return "agent restarting into " + e.Path + ": " + e.Reason }

// DefaultHealthBound is how long a new release has to pass its health gate
// when the request names no bound.
const DefaultHealthBound = 60 * time.Second

// requestRestart ends Run with a RestartError into path, once every request
// under way (this one's reply included) has been answered.
func (a *Agent) requestRestart(path, reason string) {
	a.mu.Lock()
	if a.restartInto == nil {
		a.restartInto = &RestartError{Path: path, Reason: reason}
	}
	cancel := a.cancelRun
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// upgradeTo stages req.Release, verified, starts its trial and restarts
// into it after answering.
func (a *Agent) upgradeTo(ctx context.Context, req store.UpgradeRequest) (*store.UpgradeReply, error) {
	if last, ok := a.takeAttempt("upgrade", req.Attempt); !ok {
		return nil, store.Errorf(store.CodeStale, "upgrade attempt %d is older than attempt %d", req.Attempt, last)
	}
	cur := version.Version
	rep, done, err := req.Against(cur, "machine "+a.cfg.Machine.ID)
	if err != nil || done {
		return rep, err
	}
	if a.cfg.Releases == "" {
		return nil, store.Errorf(store.CodeInvalid, "machine %s's agent has no release dir: it cannot upgrade itself", a.cfg.Machine.ID)
	}
	if !a.upgradeMu.TryLock() {
		return nil, store.Errorf(store.CodeBusy, "machine %s is upgrading already", a.cfg.Machine.ID)
	}
	defer a.upgradeMu.Unlock()
	rel, err := a.cfg.Store.Release(ctx, req.Release, version.Arch())
	if err != nil {
		return nil, err
	}
	if _, ok := rel.Binaries["control"]; !ok {
		return nil, store.Errorf(store.CodeNotFound, "release %s for %s has no control binary", req.Release, version.Arch())
	}
	path, err := a.cfg.Releases.Stage(req.Release, "control", func(w io.Writer) error {
		return a.cfg.Store.FetchReleaseBinary(ctx, rel, "control", w)
	})
	if err != nil {
		return nil, err
	}
	// The signed digest says these are the bytes the operator pushed;
	// the binary itself must say it is the release it was pushed as.
	out, err := exec.CommandContext(ctx, path, "version").Output()
	if want := "control " + req.Release + " "; err != nil || !strings.HasPrefix(string(out), want) {
		return nil, store.Errorf(store.CodeInvalid, "the control binary of release %s reports %q (%v), not %q", req.Release, strings.TrimSpace(string(out)), err, strings.TrimSpace(want))
	}
	bound := time.Duration(req.HealthBound)
	if bound <= 0 {
		bound = DefaultHealthBound
	}
	if err := a.upgradeGateway(ctx, rel, bound); err != nil {
		return nil, err
	}
	if err := a.upgradeMeshd(ctx, rel, bound); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	t := &upgrade.Trial{Rollout: req.Rollout, Attempt: req.Attempt, From: cur, FromPath: a.cfg.Self, To: req.Release, ToPath: path,
		ReadyBefore: a.readyCount(), Started: now, Deadline: now.Add(bound)}
	if err := a.cfg.Releases.Begin(t); err != nil {
		return nil, fmt.Errorf("starting the upgrade to %s: %w", req.Release, err)
	}
	a.log.Info("upgrading: restarting into the new release", zap.String("from", cur), zap.String("to", req.Release), zap.Duration("health_bound", bound))
	a.requestRestart(path, "upgrade to "+req.Release)
	rep.Restarting = true
	return rep, nil
}

func (a *Agent) readyCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, inst := range a.instances {
		if inst.Record.State == store.InstanceReady {
			n++
		}
	}
	return n
}

// setUpgrade makes t the upgrade the machine state reports.
func (a *Agent) setUpgrade(t *upgrade.Trial) {
	if t == nil {
		return
	}
	st := &store.UpgradeStatus{Rollout: t.Rollout, Attempt: t.Attempt, From: t.From, To: t.To, State: t.State, Reason: t.Reason, At: t.At}
	a.upgradeStatus.Store(st)
	a.kickState()
}

// gate is the health gate of a release on trial: within the trial's
// deadline this agent must have written its heartbeat and state, answer
// an RPC sent to its own subject, and have as many instances ready as
// there were when the upgrade began. It confirms the release, or rolls it
// back and restarts into the previous binary, saying which check failed.
func (a *Agent) gate(ctx context.Context, t *upgrade.Trial) {
	out := a.cfg.Releases.Gate(ctx, t, 200*time.Millisecond, func(ctx context.Context) string { return a.healthProblem(ctx, t) })
	switch {
	case out.Confirmed:
		a.log.Info("upgrade confirmed", zap.String("release", t.To), zap.Duration("after", time.Since(t.Started)))
		a.setUpgrade(t)
	case out.Err != nil:
		a.log.Error("upgrade failed: rolling back", zap.String("release", t.To), zap.String("reason", out.Reason), zap.Error(out.Err))
	case out.RollBackTo != "":
		a.log.Error("upgrade failed: rolling back", zap.String("release", t.To), zap.String("reason", out.Reason))
		a.setUpgrade(t)
		a.requestRestart(out.RollBackTo, "rollback from "+t.To)
	}
}

// healthProblem is what keeps the release on trial from passing; "" when
// nothing does.
func (a *Agent) healthProblem(ctx context.Context, t *upgrade.Trial) string {
	if !a.observed.Load() {
		return "its heartbeat and machine state were not written"
	}
	if err := a.answers(ctx); err != nil {
		return "it does not answer its RPCs: " + err.Error()
	}
	if n := a.readyCount(); n < t.ReadyBefore {
		return fmt.Sprintf("%d instances ready, %d were before the upgrade", n, t.ReadyBefore)
	}
	return ""
}

// answers checks that the agent serves its RPCs: connected, its
// subscription known to the server (a flush is a round trip after it), and
// its request handler answering a capacity request within a second. Agent
// credentials may not send requests, not even to their own machine, so the
// handler is asked in process.
func (a *Agent) answers(ctx context.Context) error {
	nc := a.cfg.Store.NC
	if !nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	if err := nc.FlushTimeout(time.Second); err != nil {
		return fmt.Errorf("NATS round trip: %w", err)
	}
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	done := make(chan error, 1)
	// A handler that hangs keeps this goroutine; the rollback it causes
	// replaces the process.
	go func() {
		_, err := a.handle(hctx, store.CmdCapacity, []byte("{}"))
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-hctx.Done():
		return errors.New("a capacity request got no answer within 1s")
	}
}

// IsRestart reports whether err asks to restart, and into what.
func IsRestart(err error) (*RestartError, bool) {
	var re *RestartError
	ok := errors.As(err, &re)
	return re, ok
}

// upgradeGateway swaps this machine's gateway onto rel's caddy binary, if
// the release has one and a supervised gateway runs here: the binary is
// staged, the link supervise follows points to it, and supervise is told
// to swap (SIGHUP): the new gateway starts beside the old on the same
// ports and the old one stops once the new one serves, so no request is
// dropped. A swap that fails within bound puts the link back (the old
// gateway never stopped) and refuses the upgrade.
func (a *Agent) upgradeGateway(ctx context.Context, rel *store.ReleaseRecord, bound time.Duration) error {
	if a.cfg.GatewayReleases == "" || a.cfg.GatewayPidfile == "" {
		return nil
	}
	if _, ok := rel.Binaries["caddy"]; !ok {
		return nil
	}
	gw := a.gatewayService()
	pid, err := gw.pid(ctx)
	if err != nil {
		a.log.Error("the gateway's process could not be trusted: not signalled, upgrade refused", zap.Error(err))
		return err
	}
	if pid == 0 {
		a.log.Info("no supervised gateway runs here: its binary is left alone", zap.String("pidfile", a.cfg.GatewayPidfile))
		return nil
	}
	prev, err := a.cfg.GatewayReleases.Current()
	if err != nil {
		return err
	}
	path, err := a.cfg.GatewayReleases.Stage(rel.Release, "caddy", func(w io.Writer) error {
		return a.cfg.Store.FetchReleaseBinary(ctx, rel, "caddy", w)
	})
	if err != nil {
		return err
	}
	outcome := a.cfg.GatewayPidfile + ".swap"
	_ = os.Remove(outcome)
	if err := a.cfg.GatewayReleases.Point(path); err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		_ = a.cfg.GatewayReleases.Point(prev)
		return fmt.Errorf("telling the gateway (pid %d) to swap: %w", pid, err)
	}
	a.log.Info("gateway swapping to the new release", zap.String("release", rel.Release), zap.Int("pid", pid))
	err = pollUntil(ctx, bound, func() (bool, error) {
		b, err := os.ReadFile(outcome)
		if err != nil || len(b) == 0 {
			return false, nil
		}
		if line := strings.TrimSpace(string(b)); !strings.HasPrefix(line, "ok ") {
			return false, store.Errorf(store.CodeUpgradeFailed, "the gateway of release %s did not serve (the old one still does): %s", rel.Release, line)
		}
		return true, nil
	})
	if errors.Is(err, errPollTimeout) {
		err = store.Errorf(store.CodeUpgradeFailed, "the gateway did not report its swap to %s within %s", rel.Release, bound)
	}
	if err != nil {
		_ = a.cfg.GatewayReleases.Point(prev)
		return err
	}
	a.log.Info("gateway serving the new release", zap.String("release", rel.Release))
	return nil
}

var errPollTimeout = errors.New("not within the bound")

// pollUntil calls check every pollEvery until it reports done or fails,
// ctx ends, or bound passes (errPollTimeout). The bound is checked last: an
// outcome that came since the latest look, or while this goroutine waited
// for a CPU with both the tick and the bound due, is still the outcome.
func pollUntil(ctx context.Context, bound time.Duration, check func() (done bool, err error)) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		over := false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			over = true
		case <-tick.C:
		}
		if done, err := check(); done || err != nil {
			return err
		}
		if over {
			return errPollTimeout
		}
	}
}

// pollEvery is how often pollUntil looks.
const pollEvery = 100 * time.Millisecond

// readPidfile reads a service's pidfile, not following a link: 0 when
// there is none (the service does not run here). The PID is unchecked:
// service.pid checks it before anything is signalled.
func readPidfile(path string) (int, error) {
	pid, _, err := readOwnedPidfile(path)
	return pid, err
}

// meshdSettle is how long a restarted meshd must keep running its new
// binary to count as up.
const meshdSettle = 2 * time.Second

// upgradeMeshd moves this machine's meshd onto rel's meshd binary, if the
// release has one and meshd runs here: the binary is staged in meshd's
// release dir, its link swapped, and meshd stopped (SIGTERM); its
// supervisor (systemd's Restart=always) starts it again and `meshd run`
// follows the link. Peers keep their tunnel state, so the mesh resumes at
// the new process's first handshake (the gap is measured by
// meshd/bench/upgrade-gap.sh). If the new meshd does not keep running
// within bound, the link goes back and meshd is restarted on the old
// binary, and the upgrade is refused.
func (a *Agent) upgradeMeshd(ctx context.Context, rel *store.ReleaseRecord, bound time.Duration) error {
	if a.cfg.MeshdReleases == "" || a.cfg.MeshdPidfile == "" {
		return nil
	}
	if _, ok := rel.Binaries["meshd"]; !ok {
		return nil
	}
	mesh := a.meshdService()
	pid, err := mesh.pid(ctx)
	if err != nil {
		a.log.Error("meshd's process could not be trusted: not signalled, upgrade refused", zap.Error(err))
		return err
	}
	if pid == 0 {
		a.log.Info("meshd does not run here: its binary is left alone", zap.String("pidfile", a.cfg.MeshdPidfile))
		return nil
	}
	prev, err := a.cfg.MeshdReleases.Current()
	if err != nil {
		return err
	}
	path, err := a.cfg.MeshdReleases.Stage(rel.Release, "meshd", func(w io.Writer) error {
		return a.cfg.Store.FetchReleaseBinary(ctx, rel, "meshd", w)
	})
	if err != nil {
		return err
	}
	if err := a.cfg.MeshdReleases.Point(path); err != nil {
		return err
	}
	a.log.Info("restarting meshd onto the new release", zap.String("release", rel.Release), zap.Int("pid", pid))
	if err := a.restartMeshd(ctx, pid, path, bound); err != nil {
		a.log.Error("meshd did not come up on the new release: back to the previous one", zap.Error(err))
		_ = a.cfg.MeshdReleases.Point(prev)
		if _, err := mesh.signal(ctx, syscall.SIGTERM); err != nil {
			a.log.Error("restarting meshd on the previous release", zap.Error(err))
		}
		return store.Errorf(store.CodeUpgradeFailed, "meshd of release %s did not keep running within %s: %v", rel.Release, bound, err)
	}
	return nil
}

// restartMeshd stops meshd (pid) and waits until a meshd process runs
// binary and has kept running for meshdSettle.
func (a *Agent) restartMeshd(ctx context.Context, pid int, binary string, bound time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping meshd (pid %d): %w", pid, err)
	}
	var up int
	var since time.Time
	err := pollUntil(ctx, bound, func() (bool, error) {
		cur, err := a.meshdService().pid(ctx)
		if err != nil || cur == 0 || cur == pid {
			up = 0
			return false, nil
		}
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(cur) + "/exe"); err != nil || exe != binary {
			up = 0
			return false, nil
		}
		if cur != up {
			up, since = cur, time.Now()
			return false, nil
		}
		return time.Since(since) >= meshdSettle, nil
	})
	if errors.Is(err, errPollTimeout) {
		return fmt.Errorf("no meshd running %s", binary)
	}
	if err == nil {
		a.log.Info("meshd runs the new release", zap.Int("pid", up))
	}
	return err
}
