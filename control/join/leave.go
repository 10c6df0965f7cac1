package join

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeplane/edgeplane/meshd/node"
	"github.com/edgeplane/edgeplane/store"
)

// LeaveOptions say how a box leaves.
type LeaveOptions struct {
	Layout
	// Purge also removes the services' whole state dirs: the agent's
	// instance state and logs, the gateway's routing snapshot and
	// certificate cache, meshd's keys and caches.
	Purge bool
	// Timeout bounds meshd's leave at the registrar; default 10s.
	Timeout time.Duration
}

// Left is what a leave did.
type Left struct {
	Record *Record
	// Removed are the files removed, Restored the packaged configs put
	// back.
	Removed, Restored []string
	// MeshLeft says the registrar took the box's mesh peer out; MeshErr
	// is why not, when it was asked and did not.
	MeshLeft bool
	MeshErr  error
}

// Leave undoes a join on this box (its units stopped first, by Stop):
// meshd leaves the mesh with its own credentials (the registrar drops
// its peer record), then every file the join put in place goes and the
// packaged configs come back. It does not touch the control plane's
// records of the machine: its own credentials may not, and the operator
// removes it with `control machine rm`.
func Leave(ctx context.Context, o LeaveOptions) (*Left, error) {
	rec, err := Joined(o.Layout)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, store.Errorf(store.CodeNotFound, "this box has not joined (no %s): nothing to undo", o.recordFile())
	}
	if len(rec.Files) == 0 && len(rec.Replaced) == 0 {
		return nil, store.Errorf(store.CodeConflict, "machine %s joined without `control join` (its agent's --join): leave undoes only what `control join` wrote; "+
			"stop its units and remove %s by hand", rec.Machine, o.agentDir()).With("machine", rec.Machine)
	}
	out := &Left{Record: rec}
	if _, err := node.LoadState(o.meshdDir()); err == nil {
		timeout := o.Timeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		if _, err := node.Leave(ctx, node.LeaveOptions{DataDir: o.meshdDir(), Timeout: timeout}); err != nil {
			out.MeshErr = err
		} else {
			out.MeshLeft = true
		}
	}
	for _, f := range rec.Files {
		switch err := os.Remove(f); {
		case err == nil:
			out.Removed = append(out.Removed, f)
		case !errors.Is(err, os.ErrNotExist):
			return out, fmt.Errorf("removing %s: %w", f, err)
		}
	}
	for _, dst := range rec.Replaced {
		keep := filepath.Join(o.packagedDir(), filepath.Base(dst))
		fi, err := os.Stat(keep)
		if err != nil {
			return out, fmt.Errorf("the packaged %s is gone (%w): restore it from the package (`apt-get install --reinstall`)", dst, err)
		}
		b, err := os.ReadFile(keep)
		if err != nil {
			return out, err
		}
		if err := writeLike(dst, b, fi); err != nil {
			return out, err
		}
		out.Restored = append(out.Restored, dst)
	}
	if o.Purge {
		for _, d := range []string{o.agentDir(), o.gatewayDir(), o.meshdDir()} {
			if err := os.RemoveAll(d); err != nil {
				return out, err
			}
		}
	}
	// The record goes last: a leave that stopped halfway can run again.
	return out, os.RemoveAll(o.recordDir())
}
