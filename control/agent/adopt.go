package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/control/runtime"
	"github.com/edgeplane/edgeplane/store"
)

// Instance state on disk. Every instance the agent runs has a file
// instances/<id>.json in the data dir: its runtime state (PID and start
// time, or container ID), record, spec and failures in a row. A restarted
// agent reads them back and adopts what still runs.

func (a *Agent) statePath(id string) string {
	return filepath.Join(a.cfg.DataDir, "instances", id+".json")
}

// persist writes inst's state file whole (a temporary file renamed over
// it). The snapshot is taken under persistMu, so of two concurrent writes
// the later snapshot is the one that stays, and an instance the agent has
// forgotten is not written back.
func (a *Agent) persist(inst *instance) error {
	a.persistMu.Lock()
	defer a.persistMu.Unlock()
	var b []byte
	var err error
	a.locked(func() {
		if !inst.gone {
			b, err = json.MarshalIndent(inst, "", "  ")
		}
	})
	if err != nil || b == nil {
		return err
	}
	tmp := a.statePath(inst.id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("persisting instance %s: %w", inst.id, err)
	}
	return os.Rename(tmp, a.statePath(inst.id))
}

// forget removes an instance's state file: the agent no longer runs it
// (and has marked it gone).
func (a *Agent) forget(id string) {
	a.persistMu.Lock()
	defer a.persistMu.Unlock()
	if err := os.Remove(a.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("removing instance state", zap.String("instance", id), zap.Error(err))
	}
}

// adopt re-attaches to instances a previous agent started. One that no
// longer runs is restarted as its policy says, or recorded as failed,
// explicitly, and leaves the pool.
func (a *Agent) adopt(ctx context.Context) {
	files, _ := filepath.Glob(filepath.Join(a.cfg.DataDir, "instances", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		inst := &instance{}
		if err := json.Unmarshal(b, inst); err != nil {
			a.log.Warn("ignoring unreadable instance state", zap.String("file", f), zap.Error(err))
			continue
		}
		inst.id = inst.Record.ID
		if inst.Runtime.Driver == "container" && a.cfg.Containers == nil {
			// Not gone, just out of sight: restarting it elsewhere would
			// run it twice. Left as it is until an agent with an engine
			// adopts it.
			a.log.Error("instance runs in a container but this agent has no container engine (--engine); left as it is",
				zap.String("instance", inst.id), zap.String("container", inst.Runtime.Container))
			continue
		}
		h, err := a.adoptRun(ctx, inst.Runtime)
		if err != nil {
			a.log.Warn("instance did not survive the agent restart", zap.String("instance", inst.id), zap.Error(err))
			if inst.Spec.RestartPolicy() != store.RestartAlways {
				a.forget(inst.id)
				a.markFailed(ctx, inst, "not running after agent restart")
				continue
			}
			// It is restarted as if it had just ended (a backoff already
			// under way keeps its schedule).
			next := inst.Record.NextRestart
			resume := inst.Record.State == store.InstanceBackoff && !next.IsZero()
			a.locked(func() { a.instances[inst.id] = inst })
			if resume {
				a.scheduleRestart(inst, time.Until(next))
			} else {
				a.backoff(inst, errors.New("not running after agent restart"))
			}
			continue
		}
		inst.handle = h
		if inst.Record.State == store.InstanceReady {
			inst.readySince = time.Now()
		}
		a.locked(func() { a.instances[inst.id] = inst })
		a.watch(inst)
		a.log.Info("adopted instance", zap.String("instance", inst.id), zap.Int("pid", inst.Runtime.PID))
	}
}

// adoptRun re-attaches to a run a previous agent started, with the driver
// that started it.
func (a *Agent) adoptRun(ctx context.Context, st runtime.State) (runtime.Handle, error) {
	if st.Driver == "container" {
		if a.cfg.Containers == nil {
			return nil, fmt.Errorf("adopting %s: this agent has no container engine: %w", st.ID, runtime.ErrGone)
		}
		return a.cfg.Containers.Adopt(ctx, st)
	}
	return a.cfg.Driver.Adopt(ctx, st)
}
