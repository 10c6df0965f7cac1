package main

import (
	"flag"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/logs"
	"github.com/edgeplane/edgeplane/store"
)

func setupLogs(fs *flag.FlagSet) func(*call) error {
	instance := fs.String("instance", "", "only this instance (with --access, the lines it answered)")
	follow := fs.Bool("f", false, "keep printing output as it comes (until Ctrl-C), also of instances that start later")
	since := fs.Duration("since", 0, "output of the last DURATION (to about a second; default: the last 32 KiB of each instance; with --access, the last 5m, at most the 1h kept)")
	access := fs.Bool("access", false, "the service's access lines from every gateway instead (sampled under load: the share is shown when less than all; -o json prints them as published)")
	return func(c *call) error {
		ns, svc, ok := strings.Cut(c.args[0], "/")
		if !ok || !store.ValidToken(ns) || !store.ValidToken(svc) {
			return usagef("want NAMESPACE/SERVICE, got %q", c.args[0])
		}
		o := logs.Options{Namespace: ns, Service: svc, Instance: *instance, Follow: *follow, Access: *access, JSON: c.out.json}
		if *since > 0 {
			o.Since = time.Now().Add(-*since)
		}
		return c.withStore(func(s *store.Store) error { return logs.Tail(c.ctx, s, c.stdout, o) })
	}
}
