// Package debian builds edgeplane's Debian packages with nfpm: one package
// per part (edgeplane-control, edgeplane-gateway, edgeplane-meshd), each
// with its binaries, hardened systemd units and config under /etc/edgeplane.
// The package definitions are the nfpm YAML files beside this directory;
// this package fills in the version, architecture and maintainer scripts.
package debian

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
)

// Part is one package: its nfpm definition, the units its maintainer
// scripts stop on removal and the state dirs (under /var/lib/edgeplane)
// a purge removes.
type Part struct {
	Name  string
	Units []string
	State []string
}

// Parts are the packages make package builds.
var Parts = []Part{
	{Name: "edgeplane-control", Units: []string{"edgeplane-server.service", "edgeplane-agent.service"}, State: []string{"server", "server-keys", "agent", "join"}},
	{Name: "edgeplane-gateway", Units: []string{"edgeplane-gateway.service"}, State: []string{"gateway"}},
	{Name: "edgeplane-meshd", Units: []string{"edgeplane-meshd.service"}, State: []string{"meshd"}},
}

// Options say what to package and where.
type Options struct {
	// Root is the source tree (packaging/ and caddy.json are read from it).
	Root string
	// Bin holds the built binaries: control, caddy, meshd.
	Bin string
	// Out receives the .deb files.
	Out string
	// Version is the packages' version (MAJOR.MINOR.PATCH[-PRE]).
	Version string
	// Arch is the Debian architecture (amd64, arm64).
	Arch string
}

// Build writes one .deb per part into o.Out and returns their paths.
func Build(o Options) ([]string, error) {
	if o.Version == "" || o.Arch == "" {
		return nil, errors.New("package: version and architecture are required")
	}
	for _, b := range []string{"control", "caddy", "meshd"} {
		if _, err := os.Stat(filepath.Join(o.Bin, b)); err != nil {
			return nil, fmt.Errorf("package: binary %s: %w (run make build first)", b, err)
		}
	}
	work, err := os.MkdirTemp("", "edgeplane-package-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	if err := writeGatewayConfig(filepath.Join(o.Root, "caddy.json"), filepath.Join(work, "caddy.json")); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	env := map[string]string{"VERSION": o.Version, "ARCH": o.Arch, "BIN": o.Bin, "BUILD": work}
	var out []string
	for _, p := range Parts {
		path, err := buildPart(o, p, work, env)
		if err != nil {
			return out, fmt.Errorf("package %s: %w", p.Name, err)
		}
		out = append(out, path)
	}
	return out, nil
}

func buildPart(o Options, p Part, work string, env map[string]string) (string, error) {
	cfg, err := nfpm.ParseFileWithEnvMapping(filepath.Join(o.Root, "packaging", p.Name+".yaml"), func(k string) string { return env[k] })
	if err != nil {
		return "", err
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", err
	}
	// Content paths in the definitions are relative to the source tree.
	for _, c := range info.Contents {
		if c.Source != "" && !filepath.IsAbs(c.Source) {
			c.Source = filepath.Join(o.Root, c.Source)
		}
	}
	subst := strings.NewReplacer("@UNITS@", strings.Join(p.Units, " "), "@STATE@", strings.Join(p.State, " "))
	script := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(o.Root, "packaging", "scripts", name))
		if err != nil {
			return "", err
		}
		dst := filepath.Join(work, p.Name+"."+name)
		return dst, os.WriteFile(dst, []byte(subst.Replace(string(b))), 0o755)
	}
	for dst, name := range map[*string]string{&info.Scripts.PostInstall: "postinst.sh", &info.Scripts.PreRemove: "prerm.sh", &info.Scripts.PostRemove: "postrm.sh"} {
		if *dst, err = script(name); err != nil {
			return "", err
		}
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", err
	}
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	path := filepath.Join(o.Out, pkg.ConventionalFileName(info))
	var buf bytes.Buffer
	if err := pkg.Package(info, &buf); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, buf.Bytes(), 0o644)
}

// writeGatewayConfig makes the packaged caddy.json from the source tree's:
// the same gateway, on ports 80 and 443 (the unit grants
// CAP_NET_BIND_SERVICE for them) instead of the unprivileged 8080 and 8443
// a source checkout's `make up` uses.
func writeGatewayConfig(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	r := strings.NewReplacer(`"http_port": 8080`, `"http_port": 80`, `"https_port": 8443`, `"https_port": 443`,
		`":8080"`, `":80"`, `":8443"`, `":443"`)
	s := r.Replace(string(b))
	if strings.Contains(s, "8443") || strings.Contains(s, "8080") {
		return fmt.Errorf("%s: a port 8080/8443 left after moving the gateway to 80/443", src)
	}
	return os.WriteFile(dst, []byte(s), 0o644)
}
