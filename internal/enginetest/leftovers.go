package enginetest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// leftover is a process that belongs to an engine's dir.
type leftover struct {
	pid  int
	what string
}

func (l leftover) String() string { return fmt.Sprintf("%d (%s)", l.pid, l.what) }

// processesUnder lists the processes whose command line names a path in
// dir (the engine, its containerd, shims, conmon) and their descendants (a
// container's own processes are children of its shim or conmon).
func processesUnder(dir string) []leftover {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) == "/" {
		return nil // not an engine's dir: it would match everything
	}
	// dir+"/": another engine's dir may share dir as a prefix.
	needle := []byte(filepath.Clean(dir) + "/")
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	var out []leftover
	ours := map[int]bool{}
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		if k := bytes.LastIndexByte(stat, ')'); k > 0 {
			if f := strings.Fields(string(stat[k+1:])); len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, needle) {
			ours[pid] = true
		}
	}
	isOurs := func(pid int) bool {
		for p, hops := pid, 0; p > 1 && hops < 64; p, hops = parent[p], hops+1 {
			if ours[p] {
				return true
			}
		}
		return false
	}
	for pid := range parent {
		if isOurs(pid) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, leftover{pid: pid, what: strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")})
		}
	}
	slices.SortFunc(out, func(a, b leftover) int { return a.pid - b.pid })
	return out
}

// unmountUnder detaches every mount below dir, deepest first: dockerd
// leaves the host network namespace bind-mounted in its exec root.
func unmountUnder(dir string) {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) == "/" {
		return
	}
	dir = filepath.Clean(dir)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// waitGone waits until no process under dir runs, or timeout passes, and
// returns what still runs then.
func waitGone(dir string, timeout time.Duration) []leftover {
	deadline := time.Now().Add(timeout)
	for {
		left := processesUnder(dir)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}
