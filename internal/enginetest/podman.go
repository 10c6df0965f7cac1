package enginetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// podmanConf is the containers.conf podman needs on these machines (crun
// refuses the kernel's hybrid cgroups; the sandbox refuses podman's
// default rlimits), with the engine's per-boot state in its own dir. File
// locks in that dir, not the host-wide shared-memory segment: a podman
// whose per-boot state is new "refreshes" and frees every lock in the
// segment, including those of another podman running at the same time.
const podmanConf = `[containers]
default_ulimits = []

[engine]
runtime = "runc"
tmp_dir = %q
lock_type = "file"
`

// podmanStorage keeps images and containers in the engine's dir, never
// in the host's /var/lib/containers: two test processes that build the
// same bytes would otherwise share one image ID, and one's `rmi -f` of it
// would remove the other's image and kill its containers.
const podmanStorage = `[storage]
driver = "overlay"
graphroot = %q
runroot = %q
`

// registriesConf lets podman pull from the registries tests run on
// loopback over plain HTTP (Docker allows 127.0.0.0/8 by default).
const registriesConf = `[[registry]]
location = "127.0.0.1"
insecure = true
`

// startPodman runs `podman system service` on a socket in e.dir with
// configuration files of its own, passed through the environment (the
// host's /etc/containers is never edited).
func (e *Engine) startPodman() error {
	bin, err := need("podman", "podman and runc")
	if err != nil {
		return err
	}
	if _, err := need("runc", "runc"); err != nil {
		return err
	}
	files := map[string]string{
		"containers.conf": fmt.Sprintf(podmanConf, filepath.Join(e.dir, "tmp")),
		"storage.conf":    fmt.Sprintf(podmanStorage, filepath.Join(e.dir, "storage"), filepath.Join(e.dir, "run")),
		"registries.conf": registriesConf,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(e.dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	sock := filepath.Join(e.dir, "podman.sock")
	e.Host = "unix://" + sock
	e.Env = append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(e.dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(e.dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF="+filepath.Join(e.dir, "registries.conf"))
	e.cli = []string{bin}
	cmd := exec.Command(bin, "system", "service", "--time=0", e.Host)
	cmd.Env = e.Env
	done, err := e.startDaemon(cmd, sock)
	if cmd.Process != nil {
		e.stop = func() error { return terminate(cmd.Process.Pid, done, 10*time.Second) }
	}
	return err
}
