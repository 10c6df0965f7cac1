package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/internal/upgrade"
	"github.com/edgeplane/edgeplane/store"
)

// The services the agent signals in an upgrade (the gateway's
// supervisor, meshd) run as another user, which writes their pidfiles.
// A pidfile is that user's word, and the agent is root: a PID taken on
// trust would let that user have root signal any process (sshd, the
// agent's own instances). So a PID comes from systemd when the service
// runs under it (the unit's MainPID), and otherwise from the pidfile only
// when the process it names runs the service's binary, as the pidfile's
// owner: then the agent sends nothing that owner could not send itself.

// service is a process the agent signals.
type service struct {
	// what names it in errors: "gateway", "meshd".
	what string
	// unit is its systemd unit ("" none): its MainPID is asked first.
	unit string
	// pidfile is where it writes its PID.
	pidfile string
	// names are the base names its binary may have; a binary staged in
	// releases is its too.
	names    []string
	releases upgrade.Dir
}

func (a *Agent) gatewayService() service {
	return service{what: "gateway", unit: a.cfg.GatewayUnit, pidfile: a.cfg.GatewayPidfile,
		names: []string{"caddy", "edgeplane-caddy"}, releases: a.cfg.GatewayReleases}
}

func (a *Agent) meshdService() service {
	return service{what: "meshd", unit: a.cfg.MeshdUnit, pidfile: a.cfg.MeshdPidfile,
		names: []string{"meshd"}, releases: a.cfg.MeshdReleases}
}

// pid is the service's process, checked: 0 when it does not run here.
func (sv service) pid(ctx context.Context) (int, error) {
	if pid := sv.mainPID(ctx); pid > 0 {
		if err := sv.checkExe(pid); err != nil {
			return 0, err
		}
		return pid, nil
	}
	pid, owner, err := readOwnedPidfile(sv.pidfile)
	if err != nil || pid == 0 {
		return 0, err
	}
	uid, err := procUID(pid)
	if errors.Is(err, os.ErrNotExist) {
		// A stale pidfile: the service does not run.
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if owner != 0 && uid != owner {
		return 0, store.Errorf(store.CodeInvalid, "%s pidfile %s (owned by uid %d) names pid %d, a process of uid %d: not signalled (a pidfile names only its owner's processes)",
			sv.what, sv.pidfile, owner, pid, uid).With("pidfile", sv.pidfile).With("pid", strconv.Itoa(pid))
	}
	if err := sv.checkExe(pid); err != nil {
		return 0, err
	}
	return pid, nil
}

// signal sends sig to the service's checked process and returns its PID;
// 0 and no error when it does not run.
func (sv service) signal(ctx context.Context, sig syscall.Signal) (int, error) {
	pid, err := sv.pid(ctx)
	if err != nil || pid == 0 {
		return 0, err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return pid, fmt.Errorf("signalling the %s (pid %d): %w", sv.what, pid, err)
	}
	return pid, nil
}

// mainPID asks systemd for the unit's main process; 0 when there is no
// unit, no systemd, or the unit does not run.
func (sv service) mainPID(ctx context.Context) int {
	if sv.unit == "" {
		return 0
	}
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return 0
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, "systemctl", "show", "-p", "MainPID", "--value", sv.unit).Output()
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}

// checkExe checks pid runs the service's binary.
func (sv service) checkExe(pid int) error {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return store.Errorf(store.CodeInvalid, "%s pid %d: its binary cannot be read (%v): not signalled", sv.what, pid, err).
			With("pid", strconv.Itoa(pid))
	}
	// A binary replaced on disk while it runs (a package upgrade).
	exe = strings.TrimSuffix(exe, " (deleted)")
	for _, n := range sv.names {
		if filepath.Base(exe) == n {
			return nil
		}
	}
	if sv.releases != "" && strings.HasPrefix(exe, filepath.Clean(string(sv.releases))+string(filepath.Separator)) {
		return nil
	}
	return store.Errorf(store.CodeInvalid, "%s pidfile %s names pid %d, which runs %s, not the %s (%s): not signalled",
		sv.what, sv.pidfile, pid, exe, sv.what, strings.Join(sv.names, " or ")).
		With("pidfile", sv.pidfile).With("pid", strconv.Itoa(pid)).With("exe", exe)
}

// procUID is the user pid runs as (the owner of its /proc entry).
func procUID(pid int) (int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid), &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return 0, os.ErrNotExist
		}
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return int(st.Uid), nil
}

// readOwnedPidfile reads a pidfile without following a link and returns
// the PID and the file's owner; 0 when there is none.
func readOwnedPidfile(path string) (pid, owner int, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if errors.Is(err, syscall.ELOOP) {
		return 0, 0, store.Errorf(store.CodeInvalid, "pidfile %s is a link: not followed", path).With("pidfile", path)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("pidfile: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, fmt.Errorf("pidfile: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || !ok {
		return 0, 0, store.Errorf(store.CodeInvalid, "pidfile %s is not a regular file", path).With("pidfile", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return 0, 0, fmt.Errorf("pidfile: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, 0, store.Errorf(store.CodeInvalid, "pidfile %s holds %q, not a PID", path, strings.TrimSpace(string(b))).With("pidfile", path)
	}
	return pid, int(st.Uid), nil
}
