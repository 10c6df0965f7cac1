package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrGone is returned by Adopt when the instance no longer runs.
var ErrGone = errors.New("instance is no longer running")

// Process runs each instance as a local process in its own session, with
// its output appended to <LogDir>/<id>.log.
type Process struct {
	// PollInterval is how often an adopted process (not our child, so not
	// waitable) is checked for exit; default 200ms.
	PollInterval time.Duration
}

var _ Driver = (*Process)(nil)

func (p *Process) Name() string { return "process" }

// Start launches spec.Command with HOST and PORT set.
func (p *Process) Start(ctx context.Context, spec Spec) (Handle, error) {
	if len(spec.Command) == 0 {
		return nil, fmt.Errorf("starting %s: empty command", spec.ID)
	}
	if err := os.MkdirAll(spec.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	logPath := filepath.Join(spec.LogDir, spec.ID+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening log: %w", spec.ID, err)
	}
	defer logf.Close() // the child holds its own descriptor
	// A log an older version made readable to all is tightened too.
	if err := logf.Chmod(0o600); err != nil {
		return nil, fmt.Errorf("starting %s: log: %w", spec.ID, err)
	}

	// Not exec.CommandContext: the instance must outlive the request (and
	// the agent) that started it.
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = instanceEnv(spec)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	ticks, _ := startTicks(cmd.Process.Pid)
	h := newRun(State{ID: spec.ID, Driver: p.Name(), PID: cmd.Process.Pid, StartTicks: ticks, LogPath: logPath})
	go func() { h.finish(describeExit(cmd.Wait())) }()
	return h, nil
}

func instanceEnv(spec Spec) []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	return append(env, "HOST="+spec.Host, "PORT="+strconv.Itoa(spec.Port), "EDGEPLANE_INSTANCE="+spec.ID)
}

func describeExit(err error) error {
	if err == nil {
		return &Exit{Known: true}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &Exit{Known: true, Signal: ws.Signal().String()}
		}
		return &Exit{Known: true, Code: ee.ExitCode()}
	}
	return err
}

// Adopt re-attaches to a process a previous agent started. The process is
// not our child, so its exit is noticed by polling, for as long as ctx lives.
func (p *Process) Adopt(ctx context.Context, st State) (Handle, error) {
	if st.PID <= 0 {
		return nil, fmt.Errorf("adopting %s: no pid: %w", st.ID, ErrGone)
	}
	if !sameProcess(st.PID, st.StartTicks) {
		return nil, fmt.Errorf("adopting %s (pid %d): %w", st.ID, st.PID, ErrGone)
	}
	h := newRun(st)
	interval := p.PollInterval
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !sameProcess(st.PID, st.StartTicks) {
				h.finish(&Exit{})
				return
			}
		}
	}()
	return h, nil
}

// Stop sends SIGTERM to the instance's process group, then SIGKILL after
// grace, and waits for it to end.
func (p *Process) Stop(ctx context.Context, h Handle, grace time.Duration) error {
	st := h.State()
	select {
	case <-h.Exited():
		return nil
	default:
	}
	if !sameProcess(st.PID, st.StartTicks) {
		return nil
	}
	// The instance leads its own session and process group (Setsid), so
	// the signal reaches whatever it spawned too.
	_ = syscall.Kill(-st.PID, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.Exited():
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-st.PID, syscall.SIGKILL)
	select {
	case <-h.Exited():
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("stopping %s (pid %d): still running after SIGKILL", st.ID, st.PID)
	}
}

// startTicks reads field 22 of /proc/<pid>/stat: the process start time.
func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command name is in parentheses and may contain spaces.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected stat format")
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is state (field 3); start time is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("unexpected stat format")
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, ErrGone
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func sameProcess(pid int, ticks uint64) bool {
	got, err := startTicks(pid)
	if err != nil {
		return false
	}
	return ticks == 0 || got == ticks
}
