package fleetsim

import (
	"fmt"
	"syscall"
)

// RaiseFileLimit makes room for n open files: every simulated agent and
// gateway holds a connection, and a server in the same process the other
// end of it. Past the hard limit only root may raise it.
func RaiseFileLimit(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n {
		return nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(n, lim.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("raising the open file limit from %d (hard %d) to %d: %w", lim.Cur, lim.Max, n, err)
	}
	return nil
}
