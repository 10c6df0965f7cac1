package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/failpoint"
	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// The storage node's side of `control storage upgrade`: a storage node's
// `control server` moves itself onto a release as an agent does
// (internal/upgrade: the release staged in DATA/releases, current
// swapped, an exec in place, a trial with a health gate, a rollback to
// the binary it ran before), told by a signed order on a subject only
// control credentials reach (store.StorageNodeSubject).

// DefaultNodeHealthBound is how long a storage node's new release has to
// pass its health gate when the order names no bound: a node that was
// down for a while catches up on every stream first.
const DefaultNodeHealthBound = 2 * time.Minute

// NodeUpgrades is a storage node's `control server` as far as its release
// goes: the release dir, the binary it runs, the trial this start belongs
// to, and the restart an upgrade (or a rollback) asks for. The server
// makes it with LaunchNode before anything else, Binds how to end itself,
// tells it the node once booted (Booted), serves orders (Serve), runs the
// health gate (Gate) and, once it stopped, execs what Restart names.
type NodeUpgrades struct {
	Releases upgrade.Dir
	// Self is this process's binary (the FromPath of a trial it starts).
	Self string
	// Trial is the trial this start belongs to (nil: none).
	Trial  *upgrade.Trial
	Logger *zap.Logger

	node atomic.Pointer[storagenode.Node]
	// busy holds one order at a time.
	busy sync.Mutex

	mu          sync.Mutex
	stop        func()
	restartInto string
	reason      string
}

// LaunchNode settles which binary runs the `control server` of data dir
// data, as the agent's Launch does: a staged release current names runs
// instead (this call then goes on as it and returns only if it cannot),
// and a release on trial that starts a second time without having passed
// its health gate is rolled back first.
func LaunchNode(data string, logger *zap.Logger) (*NodeUpgrades, error) {
	self, err := upgrade.Self()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	u := &NodeUpgrades{Releases: upgrade.ForData(data), Self: self, Logger: logger}
	launched := os.Getenv(upgrade.LaunchedEnv) != ""
	os.Unsetenv(upgrade.LaunchedEnv)
	next, trial, err := u.Releases.Launch(self, launched)
	if err != nil {
		return nil, fmt.Errorf("storage node releases: %w", err)
	}
	if next != "" {
		return nil, upgrade.Exec(next, append([]string{next}, os.Args[1:]...), true)
	}
	if trial != nil && trial.State == upgrade.StateTrial && trial.To == version.Version {
		u.Trial = trial
	}
	return u, nil
}

// Bind says how to end the server when it is to restart as another
// binary: stop ends its run, and the server then calls Restart.
func (u *NodeUpgrades) Bind(stop func()) {
	u.mu.Lock()
	u.stop = stop
	u.mu.Unlock()
}

// Booted tells u the storage node this server runs, once it is up.
func (u *NodeUpgrades) Booted(n *storagenode.Node) { u.node.Store(n) }

// Restart is the binary the server is to go on as once it stopped, and
// why; "" when it is not to.
func (u *NodeUpgrades) Restart() (path, reason string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.restartInto, u.reason
}

// Exec goes on as the binary Restart names, with this process's
// arguments: the storage node starts again from its data dir.
func (u *NodeUpgrades) Exec() error {
	path, _ := u.Restart()
	return upgrade.Exec(path, append([]string{path}, os.Args[1:]...), false)
}

func (u *NodeUpgrades) requestRestart(path, reason string) {
	u.mu.Lock()
	if u.restartInto == "" {
		u.restartInto, u.reason = path, reason
	}
	stop := u.stop
	u.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Serve tells u the storage node n (Booted) and answers its upgrade
// orders until ctx ends; on a nil u or without a storage node of its own
// it does nothing. The returned stop waits for an answer under way and
// flushes it, so that the reply to the order that restarts the server
// leaves before it stops.
func (u *NodeUpgrades) Serve(ctx context.Context, n *storagenode.Node, data string) (func(), error) {
	if u == nil || n.Server == nil {
		return func() {}, nil
	}
	u.Booted(n)
	book, err := store.OpenOrderBook(filepath.Join(data, "storage-orders"))
	if err != nil {
		return nil, err
	}
	name := n.Server.Name()
	stop, err := store.Serve(ctx, n.Conn, n.Store.Names.StorageNodeSubject(name, "*"), "", store.StorageNodeMarker(name),
		func(hctx context.Context, command string, raw []byte) (any, error) {
			if command != store.CmdStorageUpgrade {
				return nil, store.Errorf(store.CodeInvalid, "storage node %s: unknown command %q", name, command)
			}
			if _, err := n.Store.VerifyStorageOrder(hctx, name, command, store.RequestHeader(hctx), raw, book); err != nil {
				u.Logger.Warn("storage upgrade order refused", zap.Error(err))
				return nil, err
			}
			var req store.UpgradeRequest
			if err := json.Unmarshal(raw, &req); err != nil {
				return nil, store.Errorf(store.CodeInvalid, "decoding the upgrade order: %w", err)
			}
			return u.upgradeTo(hctx, n, name, req)
		})
	if err != nil {
		book.Close()
		return nil, err
	}
	return func() {
		stop()
		_ = n.Conn.FlushTimeout(time.Second)
		book.Close()
	}, nil
}

// upgradeTo stages req.Release's control binary, verified (its signed
// record, its digest, and the version the binary itself reports), starts
// its trial and asks the server to restart into it after answering.
func (u *NodeUpgrades) upgradeTo(ctx context.Context, n *storagenode.Node, name string, req store.UpgradeRequest) (*store.UpgradeReply, error) {
	cur := version.Version
	rep, done, err := req.Against(cur, "storage node "+name)
	if err != nil || done {
		return rep, err
	}
	if !u.busy.TryLock() {
		return nil, store.Errorf(store.CodeBusy, "storage node %s is upgrading already", name).With("node", name)
	}
	defer u.busy.Unlock()
	if path, _ := u.Restart(); path != "" {
		return nil, store.Errorf(store.CodeBusy, "storage node %s is restarting already", name).With("node", name)
	}
	rel, err := n.Store.Release(ctx, req.Release, version.Arch())
	if err != nil {
		return nil, err
	}
	path, err := u.Releases.Stage(req.Release, "control", func(w io.Writer) error {
		return n.Store.FetchReleaseBinary(ctx, rel, "control", w)
	})
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, path, "version").Output()
	if want := "control " + req.Release + " "; err != nil || !strings.HasPrefix(string(out), want) {
		return nil, store.Errorf(store.CodeInvalid, "the control binary of release %s reports %q (%v), not %q", req.Release, strings.TrimSpace(string(out)), err, strings.TrimSpace(want))
	}
	bound := time.Duration(req.HealthBound)
	if bound <= 0 {
		bound = DefaultNodeHealthBound
	}
	now := time.Now().UTC()
	t := &upgrade.Trial{Rollout: req.Rollout, Attempt: req.Attempt, From: cur, FromPath: u.Self, To: req.Release, ToPath: path,
		Started: now, Deadline: now.Add(bound)}
	if err := u.Releases.Begin(t); err != nil {
		return nil, fmt.Errorf("starting the upgrade to %s: %w", req.Release, err)
	}
	u.Logger.Info("storage node upgrading: restarting into the new release", zap.String("from", cur), zap.String("to", req.Release), zap.Duration("health_bound", bound))
	// The restart waits for this answer: Serve's stop, called as the
	// server stops, waits for the handler and flushes its reply.
	u.requestRestart(path, "upgrade to "+req.Release)
	rep.Restarting = true
	return rep, nil
}

// Gate is the health gate of a release on trial (none: it returns at
// once): within the trial's deadline the storage node must have started,
// see write quorum and a meta leader, and hold every replica it holds
// current (caught up with its stream's leader). It confirms the release,
// or rolls it back and restarts the server into the previous binary,
// saying which check failed. It returns when ctx ends or it decided.
func (u *NodeUpgrades) Gate(ctx context.Context) {
	t := u.Trial
	if t == nil {
		return
	}
	// A test build can make a release never pass (storage_gate@VERSION
	// with :pause): the check stays failing until the deadline. The
	// goroutine blocked in the failpoint ends with the process's exec.
	held := make(chan struct{})
	go func() {
		failpoint.Hit("storage_gate@" + version.Version)
		close(held)
	}()
	out := u.Releases.Gate(ctx, t, 250*time.Millisecond, func(ctx context.Context) string {
		select {
		case <-held:
			return u.healthProblem(ctx)
		default:
			return "held at failpoint storage_gate@" + version.Version
		}
	})
	switch {
	case out.Confirmed:
		u.Logger.Info("storage node upgrade confirmed", zap.String("release", t.To), zap.Duration("after", time.Since(t.Started)))
	case out.Err != nil:
		u.Logger.Error("storage node upgrade failed: rolling back", zap.String("release", t.To), zap.String("reason", out.Reason), zap.Error(out.Err))
	case out.RollBackTo != "":
		u.Logger.Error("storage node upgrade failed: rolling back", zap.String("release", t.To), zap.String("reason", out.Reason))
		u.requestRestart(out.RollBackTo, "rollback from "+t.To)
	}
}

// healthProblem is what keeps the node's release on trial from passing;
// "" when nothing does.
func (u *NodeUpgrades) healthProblem(ctx context.Context) string {
	n := u.node.Load()
	if n == nil || n.Server == nil || n.Store == nil {
		return "the storage node has not started yet"
	}
	name := n.Server.Name()
	st, err := storagenode.LocalStatus(n.Server)
	if err != nil {
		return err.Error()
	}
	if st.MetaLeader == "" {
		return "it sees no JetStream meta leader"
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := n.Store.RequireQuorum(cctx); err != nil {
		return "no write quorum: " + err.Error()
	}
	pl, err := n.Store.Placement(cctx)
	if err != nil {
		return "reading the replica placement: " + err.Error()
	}
	var behind []string
	for _, p := range pl {
		if p.Leader == "" || slices.Contains(p.Lagging, name) {
			behind = append(behind, p.Stream)
		}
	}
	if len(behind) > 0 {
		return fmt.Sprintf("%d streams without a leader or with this node's replica catching up (%s)", len(behind), strings.Join(behind, ", "))
	}
	return ""
}

// StartNode is the start of `control server` as far as its release goes,
// with a storage node of its own (node): LaunchNode (going on as another
// binary when the release dir says so) and the health gate of a release
// on trial. The server runs under the returned ctx: a release the node is
// told to move to, or a rollback, ends it; finish, called with the
// server's result once everything has stopped, then goes on as that
// binary in this process, or returns the result as it is. Without a
// storage node (`--nats`), the NodeUpgrades is nil and does nothing.
func StartNode(parent context.Context, data string, node bool, progress io.Writer, logger *zap.Logger) (context.Context, *NodeUpgrades, func(error) error, error) {
	ctx, stop := context.WithCancel(parent)
	if !node {
		return ctx, nil, func(err error) error { stop(); return err }, nil
	}
	u, err := LaunchNode(data, logger.Named("upgrade"))
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	u.Bind(stop)
	gated := make(chan struct{})
	go func() {
		defer close(gated)
		u.Gate(ctx)
	}()
	finish := func(err error) error {
		stop()
		<-gated
		path, reason := u.Restart()
		if path == "" {
			return err
		}
		fmt.Fprintf(progress, "control server restarting as %s: %s\n", path, reason)
		_ = logger.Sync()
		return u.Exec()
	}
	return ctx, u, finish, nil
}
