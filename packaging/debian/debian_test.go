package debian

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Build refuses what it cannot package, saying what is missing, and
// writes nothing.
func TestBuildRefusals(t *testing.T) {
	out := t.TempDir()
	for _, o := range []Options{
		{Root: "../..", Bin: t.TempDir(), Out: out, Version: "1.0.0", Arch: "amd64"},
		{Root: "../..", Bin: t.TempDir(), Out: out, Arch: "amd64"},
	} {
		_, err := Build(o)
		if err == nil {
			t.Fatalf("built %+v", o)
		}
		if o.Version != "" && !strings.Contains(err.Error(), "run make build first") {
			t.Errorf("missing binaries: %v", err)
		}
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
}

// TestPackagesInstallRemovePurge builds the packages from this tree,
// installs them with dpkg on this machine, checks every file lands where
// the README says and every unit passes systemd-analyze verify, then
// removes them (the data and config stay) and purges them (they go).
func TestPackagesInstallRemovePurge(t *testing.T) {
	const ver = "1.2.3-test"
	names, dpkg := install(t, ver)

	for _, f := range []string{
		"/usr/bin/control", "/usr/bin/edgeplane-caddy", "/usr/bin/meshd",
		"/usr/lib/systemd/system/edgeplane-server.service", "/usr/lib/systemd/system/edgeplane-agent.service",
		"/usr/lib/systemd/system/edgeplane-gateway.service", "/usr/lib/systemd/system/edgeplane-meshd.service",
		"/etc/edgeplane/server.env", "/etc/edgeplane/agent.env", "/etc/edgeplane/meshd.env",
		"/etc/edgeplane/gateway.env", "/etc/edgeplane/caddy.json", "/var/lib/edgeplane",
	} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after install: %v", err)
		}
	}
	// The installed binaries are the ones built, reporting their version.
	for bin, want := range map[string]string{"/usr/bin/control": "control " + ver, "/usr/bin/meshd": "meshd " + ver} {
		out, err := exec.Command(bin, "version").Output()
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s version = %q (%v), want %q...", bin, out, err, want)
		}
	}
	if _, err := exec.Command("getent", "passwd", "edgeplane").Output(); err != nil {
		t.Error("postinst made no edgeplane user")
	}
	// The gateway's config is the source tree's, on the privileged ports
	// its unit grants, and readable by the user it runs as.
	cfg, err := os.ReadFile("/etc/edgeplane/caddy.json")
	if err != nil || !strings.Contains(string(cfg), `":443"`) || strings.Contains(string(cfg), "8443") {
		t.Errorf("packaged caddy.json not on port 443: %v", err)
	}
	if out, _ := exec.Command("stat", "-c", "%G", "/etc/edgeplane/caddy.json").Output(); strings.TrimSpace(string(out)) != "edgeplane" {
		t.Errorf("caddy.json group %q, want edgeplane", strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("/usr/bin/edgeplane-caddy", "validate", "--config", "/etc/edgeplane/caddy.json").CombinedOutput(); err != nil {
		t.Errorf("caddy validate of the packaged config: %v\n%s", err, out)
	}

	// Every unit verifies with no warning at all (an unknown or misspelt
	// directive is only a warning to systemd, and would weaken the unit
	// silently).
	for _, p := range Parts {
		for _, u := range p.Units {
			out, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/"+u).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
			}
		}
	}

	// Remove: binaries and units go; state and config stay.
	data := map[string]string{}
	for _, p := range Parts {
		for _, d := range p.State {
			f := filepath.Join("/var/lib/edgeplane", d, "kept")
			if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, []byte(d), 0o600); err != nil {
				t.Fatal(err)
			}
			data[f] = d
		}
	}
	dpkg(append([]string{"--remove"}, names...)...)
	for _, f := range []string{"/usr/bin/control", "/usr/bin/edgeplane-caddy", "/usr/bin/meshd", "/usr/lib/systemd/system/edgeplane-agent.service"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s still there after remove", f)
		}
	}
	for f, want := range data {
		if b, err := os.ReadFile(f); err != nil || string(b) != want {
			t.Errorf("remove lost %s: %v", f, err)
		}
	}
	if _, err := os.Stat("/etc/edgeplane/agent.env"); err != nil {
		t.Errorf("remove lost the config: %v", err)
	}

	// Purge: state, config and the user go.
	dpkg(append([]string{"--purge"}, names...)...)
	for _, f := range []string{"/var/lib/edgeplane", "/etc/edgeplane"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s still there after purge", f)
		}
	}
	if _, err := exec.Command("getent", "passwd", "edgeplane").Output(); err == nil {
		t.Error("purge left the edgeplane user")
	}
}

// install builds the packages from this tree (binaries reporting version
// ver) and installs them with dpkg on this machine, purged again when t
// ends, whatever happened. It returns the packages' names and a dpkg that
// fails t when dpkg does. It skips t where that cannot be done: not root,
// no dpkg or systemd tools, or the packages installed already.
func install(t *testing.T, ver string) ([]string, func(args ...string) string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("installing packages needs root (CI runs as root)")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: not a Debian system with systemd tools", tool)
		}
	}
	for _, p := range Parts {
		if out, err := exec.Command("dpkg-query", "-W", "-f", "${Status}", p.Name).Output(); err == nil && strings.Contains(string(out), "installed") {
			t.Skipf("%s is installed on this machine: not touching it", p.Name)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for name, pkg := range map[string]string{"control": "./control", "caddy": "./caddymodule/cmd/caddy", "meshd": "./meshd"} {
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/edgeplane/edgeplane/internal/version.Version="+ver, "-o", filepath.Join(bin, name), pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	debs, err := Build(Options{Root: root, Bin: bin, Out: t.TempDir(), Version: ver, Arch: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	if len(debs) != len(Parts) {
		t.Fatalf("built %d packages, want %d", len(debs), len(Parts))
	}
	names := make([]string, len(Parts))
	for i, p := range Parts {
		names[i] = p.Name
	}
	dpkg := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("dpkg", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Cleanup(func() {
		// Whatever happened above, leave the machine as it was.
		_ = exec.Command("dpkg", append([]string{"--purge"}, names...)...).Run()
	})
	dpkg(append([]string{"-i"}, debs...)...)
	return names, dpkg
}
