package enginetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// startDocker runs a dockerd of the test's own: its data and exec roots
// (and so its containerd, shims and the network namespace it bind-mounts)
// in e.dir, no bridge and no iptables rules (containers use the host's
// network), no daemon.json from /etc. It is stopped by its pid file.
func (e *Engine) startDocker() error {
	bin, err := need("dockerd", "docker.io")
	if err != nil {
		return err
	}
	// The client of the docker.io package, which matches its daemon's API
	// and still has the classic builder; a newer client elsewhere on PATH
	// is only the fallback.
	client := "/usr/bin/docker"
	if _, err := os.Stat(client); err != nil {
		if client, err = need("docker", "docker.io"); err != nil {
			return err
		}
	}
	// Its own daemon.json, with its own trust key: dockerd otherwise
	// creates /etc/docker/key.json, which two daemons starting at once
	// could both write.
	conf := filepath.Join(e.dir, "daemon.json")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "{\"deprecated-key-path\": %q}\n", filepath.Join(e.dir, "key.json")), 0o644); err != nil {
		return err
	}
	sock := filepath.Join(e.dir, "docker.sock")
	pidFile := filepath.Join(e.dir, "docker.pid")
	e.Host = "unix://" + sock
	// DOCKER_CONFIG: not the user's ~/.docker (credential helpers, contexts).
	e.Env = append(os.Environ(), "DOCKER_BUILDKIT=0", "DOCKER_CONFIG="+filepath.Join(e.dir, "client"))
	e.cli = []string{client, "-H", e.Host}
	// dockerd uses a system containerd when one runs (else it starts its
	// own in the exec root): namespaces named after e.dir keep two test
	// daemons on one containerd apart.
	ns := filepath.Base(e.dir)
	cmd := exec.Command(bin, "--config-file", conf, "--data-root", filepath.Join(e.dir, "data"), "--exec-root", filepath.Join(e.dir, "exec"),
		"-H", e.Host, "--pidfile", pidFile, "--containerd-namespace", ns, "--containerd-plugins-namespace", ns+"-plugins",
		"--iptables=false", "--ip-forward=false", "--bridge=none", "--log-level=warn")
	done, err := e.startDaemon(cmd, sock)
	if cmd.Process != nil {
		e.stop = func() error {
			select {
			case <-done:
				return nil // it already ended (the start failed)
			default:
			}
			b, err := os.ReadFile(pidFile)
			pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || perr != nil || pid != cmd.Process.Pid {
				// No pid file (it never got that far), or not ours: stop
				// the process this test started.
				_ = terminate(cmd.Process.Pid, done, 30*time.Second)
				return fmt.Errorf("pid file %s: %q (%v), started pid %d", pidFile, b, err, cmd.Process.Pid)
			}
			return terminate(pid, done, 30*time.Second)
		}
	}
	return err
}
