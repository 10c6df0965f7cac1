package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/store"
)

func setupStorageForget(fs *flag.FlagSet) func(*call) error {
	f := addStorageFlags(fs, false)
	authDir := fs.String("auth-dir", "", "this storage node's auth dir (system-account keys; default DATA/auth)")
	data := fs.String("data", "", "this storage node's data dir, for its auth dir")
	return func(c *call) error {
		dir := *authDir
		if dir == "" {
			if *data == "" {
				return usagef("--data DIR or --auth-dir DIR is required: taking a server out of the meta group needs the system account's keys (run this on a storage node)")
			}
			dir = filepath.Join(*data, "auth")
		}
		return f.withView(c, true, func(s *store.Store, view *storage.View) error {
			id := c.args[0]
			size, err := storage.Forget(c.ctx, s, view, id, storage.ForgetConfig{URL: c.client.NATSURL, AuthDir: dir, Wait: f.wait})
			if err != nil {
				return err
			}
			return c.out.emit(map[string]any{"node": id, "forgotten": true, "meta_group_size": size}, func(w io.Writer) {
				fmt.Fprintf(w, "storage node %s left the JetStream meta group (now %d members); the name stays out of it: a replacement machine takes a new --name\n", id, size)
			})
		})
	}
}
