package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/control/meshkeys"
	"github.com/edgeplane/edgeplane/store"
)

func setupMeshRotate(fs *flag.FlagSet) func(*call) error {
	machine := fs.String("machine", "", "rotate this machine's key (default: every meshd node's)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the nodes to register their new keys (0: ask and return)")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			rots, pending, err := meshkeys.Rotate(c.ctx, s, *machine, *wait)
			if err != nil {
				return err
			}
			if err := c.out.emit(rots, func(w io.Writer) { meshkeys.WriteText(w, rots) }); err != nil {
				return err
			}
			if pending > 0 && *wait > 0 {
				return fmt.Errorf("%d of %d nodes did not rotate within %s; they still will once running and connected", pending, len(rots), *wait)
			}
			return nil
		})
	}
}
