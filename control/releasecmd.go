package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/internal/version"
	"github.com/edgeplane/edgeplane/store"
)

func setupReleasePush(fs *flag.FlagSet) func(*call) error {
	arch := fs.String("arch", version.Arch(), "GOOS/GOARCH the binaries are built for")
	bin := fs.String("bin", "", "dir holding the binaries (control, caddy, meshd; those present are pushed), as make build writes them")
	files := map[string]*string{}
	for _, name := range store.ReleaseBinaryNames {
		files[name] = fs.String(name, "", "the "+name+" binary `FILE` (instead of --bin)")
	}
	notes := fs.String("notes", "", "a line about the release, shown by release ls")
	return func(c *call) error {
		rel := c.args[0]
		if _, err := version.Parse(rel); err != nil {
			return usagef("%v", err)
		}
		paths := map[string]string{}
		for name, f := range files {
			switch {
			case *f != "":
				paths[name] = *f
			case *bin != "":
				p := filepath.Join(*bin, name)
				if _, err := os.Stat(p); err == nil {
					paths[name] = p
				}
			}
		}
		if len(paths) == 0 {
			return usagef("nothing to push: give --bin DIR or --control/--caddy/--meshd FILE")
		}
		readers := map[string]io.Reader{}
		for name, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				return store.Errorf(store.CodeInvalid, "%v", err).With("binary", name)
			}
			defer f.Close()
			readers[name] = f
		}
		return c.withStore(func(s *store.Store) error {
			r := &store.ReleaseRecord{Release: rel, Arch: *arch, Notes: *notes}
			if err := s.PushRelease(c.ctx, r, readers); err != nil {
				return err
			}
			return c.out.emit(r, func(w io.Writer) {
				fmt.Fprintf(w, "release %s for %s pushed, signed:\n", r.Release, r.Arch)
				printers.ReleaseBinaries(w, r)
			})
		})
	}
}

func setupReleaseList(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			good, bad, err := s.ListReleases(c.ctx)
			if err != nil {
				return err
			}
			for _, e := range bad {
				fmt.Fprintf(c.stderr, "refused: %v\n", e)
			}
			if good == nil {
				good = []store.ReleaseRecord{}
			}
			return c.out.emit(good, func(w io.Writer) { printers.Releases(w, good) })
		})
	}
}
