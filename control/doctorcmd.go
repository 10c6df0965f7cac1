package main

import (
	"flag"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// CodeIncoherent is doctor's failure: the layers disagree.
const CodeIncoherent = "incoherent"

func setupDoctor(fs *flag.FlagSet) func(*call) error {
	var o doctor.Options
	var gateways, dnsServers listFlag
	fs.Var(&gateways, "gateway", "Caddy admin API of a gateway to read directly, e.g. http://127.0.0.1:2019 (repeatable; every connected gateway's report in the store is read anyway)")
	fs.Var(&dnsServers, "dns", "address of an edgeplane DNS server to ask, e.g. 127.0.0.1:53 (repeatable)")
	fs.StringVar(&o.Zone, "zone", doctor.DefaultZone, "zone the DNS servers answer")
	fs.DurationVar(&o.ProbeTimeout, "probe-timeout", 2*time.Second, "how long each agent, gateway and DNS server has to answer")
	return func(c *call) error {
		o.Gateways, o.DNS = gateways, dnsServers
		return c.withStore(func(s *store.Store) error {
			rep, err := doctor.Run(c.ctx, s, o)
			if err != nil {
				return err
			}
			if err := c.out.emit(rep, func(w io.Writer) { printers.Doctor(w, rep) }); err != nil {
				return err
			}
			if !rep.Coherent {
				return store.Errorf(CodeIncoherent, "%d problems found", rep.Problems())
			}
			return nil
		})
	}
}
