// Command build writes edgeplane's Debian packages (make package runs it).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/packaging/debian"
)

func main() {
	o := debian.Options{}
	flag.StringVar(&o.Root, "root", ".", "source tree")
	flag.StringVar(&o.Bin, "bin", "bin", "dir of the built binaries (control, caddy, meshd)")
	flag.StringVar(&o.Out, "out", "dist", "dir the .deb files are written to")
	flag.StringVar(&o.Version, "version", "", "package version, MAJOR.MINOR.PATCH[-PRE] (required)")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "Debian architecture")
	flag.Parse()
	if _, err := version.Parse(o.Version); err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(2)
	}
	paths, err := debian.Build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}
