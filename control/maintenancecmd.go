package main

import (
	"flag"
	"time"

	"github.com/edgeplane/edgeplane/control/maintenance"
	"github.com/edgeplane/edgeplane/store"
)

func setupMaintenanceList(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := maintenance.ReadList(c.ctx, s)
			if err != nil {
				return err
			}
			return c.out.emit(list, list.WriteText)
		})
	}
}

// setupMaintenance is on and off: each publishes the namespace's or
// service's maintenance record (maintenance.Set).
func setupMaintenance(on bool) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		wait := fs.Duration("wait", 0, "then wait, at most this long, until every live gateway applied the change (0: return once it is stored)")
		var message *string
		var retry *time.Duration
		if on {
			message = fs.String("message", "", "the text the 503 page shows (HTML-escaped; in the JSON answer's message)")
			retry = fs.Duration("retry-after", maintenance.DefaultRetryAfter, "the Retry-After the 503 answer gives")
		}
		return func(c *call) error {
			req := maintenance.Request{Namespace: c.args[0], On: on, Wait: *wait}
			if len(c.args) > 1 {
				req.Service = c.args[1]
			}
			if on {
				req.Message, req.RetryAfter = *message, *retry
			}
			return c.withStore(func(s *store.Store) error {
				ch, err := maintenance.Set(c.ctx, s, req)
				if err != nil {
					return err
				}
				return c.out.emit(ch, ch.WriteText)
			})
		}
	}
}
