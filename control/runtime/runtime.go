// Package runtime starts and stops instances on one machine. A Driver hides
// how an instance runs (a local process today, a container later) behind a
// small contract that survives the agent restarting: what Start returned can
// be recovered with Adopt from the State the agent persisted.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Spec is everything a driver needs to start one instance.
type Spec struct {
	ID      string
	Command []string
	// Env is the service's environment; the driver adds HOST and PORT.
	Env  map[string]string
	Host string
	Port int
	// LogDir receives the instance's output.
	LogDir string

	// Image is what a container driver runs: an image ID as a deploy
	// pinned it. Command, if set, replaces its entrypoint.
	Image string
	// ReadOnlyRoot mounts the container's root filesystem read-only.
	ReadOnlyRoot bool
	// CPUs and Memory (bytes) limit a container; 0 is no limit.
	CPUs   float64
	Memory int64
	// Labels go on the container (the driver adds its own).
	Labels map[string]string
}

// State is what the agent persists about a running instance so that a
// restarted agent can adopt it. Drivers fill in their own fields.
type State struct {
	ID     string `json:"id"`
	Driver string `json:"driver"`
	PID    int    `json:"pid,omitempty"`
	// StartTicks identifies the process incarnation (start time in clock
	// ticks since boot) so a reused PID is never mistaken for ours.
	StartTicks uint64 `json:"start_ticks,omitempty"`
	// Container is for container drivers.
	Container string `json:"container,omitempty"`
	LogPath   string `json:"log_path,omitempty"`
}

// Exit is how an instance ended, as Handle.ExitErr reports it when the
// driver knows.
type Exit struct {
	// Known is false when the driver saw the instance gone without its
	// status (a process adopted after an agent restart).
	Known bool
	// Code is the exit status; Signal, if set, the signal that killed it.
	Code   int
	Signal string
}

func (e *Exit) Error() string {
	switch {
	case !e.Known:
		return "exited (status unknown)"
	case e.Signal != "":
		return "killed by signal " + e.Signal
	default:
		return fmt.Sprintf("exited with status %d", e.Code)
	}
}

// Clean reports whether err (from ExitErr) is a known exit with status 0:
// the one end a restart policy of on-failure leaves alone.
func Clean(err error) bool {
	var e *Exit
	return errors.As(err, &e) && e.Known && e.Signal == "" && e.Code == 0
}

// Handle is a started or adopted instance.
type Handle interface {
	State() State
	// Exited is closed when the instance stops running, for any reason.
	Exited() <-chan struct{}
	// ExitErr describes how it ended; valid after Exited is closed.
	ExitErr() error
}

// run is the Handle both drivers return: the run's state, and how it
// ended once it has (finish, which only the first call does).
type run struct {
	st     State
	exited chan struct{}
	once   sync.Once
	err    error
}

func newRun(st State) *run { return &run{st: st, exited: make(chan struct{})} }

func (r *run) State() State            { return r.st }
func (r *run) Exited() <-chan struct{} { return r.exited }
func (r *run) ExitErr() error {
	select {
	case <-r.exited:
		return r.err // written before exited closed
	default:
		return nil
	}
}

func (r *run) finish(err error) {
	r.once.Do(func() {
		r.err = err
		close(r.exited)
	})
}

// Driver runs instances.
//
// Start launches the instance detached from the agent: stopping or crashing
// the agent must not stop it. Adopt re-attaches to an instance described by
// a persisted State and fails with ErrGone if it no longer runs. Stop asks the
// instance to end (SIGTERM or equivalent), forces it after grace, and returns
// once it has ended; stopping an ended instance is not an error.
type Driver interface {
	Name() string
	Start(ctx context.Context, spec Spec) (Handle, error)
	Adopt(ctx context.Context, st State) (Handle, error)
	Stop(ctx context.Context, h Handle, grace time.Duration) error
}
