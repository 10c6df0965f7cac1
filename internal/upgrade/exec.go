package upgrade

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Self is the binary this process runs, links resolved: what a trial's
// FromPath names, and what Launch compares current with.
func Self() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("this process's binary: %w", err)
	}
	return filepath.EvalSymlinks(self)
}

// Exec goes on as binary path in this process, with args (args[0]
// included) and this process's environment, marked launched
// (LaunchedEnv) when Launch chose path. The PID stays: a supervisor
// (systemd, a test's harness) sees no exit, and children keep their
// parent. It returns only if the exec failed.
func Exec(path string, args []string, launched bool) error {
	env := os.Environ()
	if launched {
		env = append(env, LaunchedEnv+"=1")
	}
	if err := syscall.Exec(path, args, env); err != nil {
		return fmt.Errorf("going on as %s: %w", path, err)
	}
	return nil
}
