package main

import (
	"flag"
	"io"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/signers"
)

func setupStorageImport(fs *flag.FlagSet) func(*call) error {
	from := fs.String("from", "", "the stopped single box's data dir (its --data) to copy into the cluster (required)")
	fromAuth := fs.String("from-auth-dir", "", "the single box's auth dir (default FROM/auth)")
	data := fs.String("data", "", "a storage node's data dir, for the cluster's trust root in DATA/auth (required unless --auth-dir)")
	authDir := fs.String("auth-dir", "", "the cluster's auth dir, holding its trust root (overrides --data)")
	return func(c *call) error {
		if *from == "" {
			return usagef("--from DIR (the single box's data dir) is required")
		}
		root, err := signers.RootFrom(*authDir, *data)
		if err != nil {
			return err
		}
		// Per-stream lines are for a person; JSON has them in its answer.
		progress := c.out.w
		if c.out.json {
			progress = io.Discard
		}
		// A writer's open has checked write quorum; the import needs
		// nothing else of the cluster's state.
		return c.withStore(func(s *store.Store) error {
			rep, err := storage.Import(c.ctx, s, storage.ImportConfig{From: *from, FromAuthDir: *fromAuth, Root: root, Progress: progress})
			if err != nil {
				return err
			}
			return c.out.emit(rep, func(w io.Writer) { printers.Import(w, rep) })
		})
	}
}
