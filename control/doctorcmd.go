package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/doctor"
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
			if err := c.out.emit(rep, func(w io.Writer) { printDoctor(w, rep) }); err != nil {
				return err
			}
			if !rep.Coherent {
				return store.Errorf(CodeIncoherent, "%d problems found", rep.Problems())
			}
			return nil
		})
	}
}

func printDoctor(w io.Writer, rep *doctor.Report) {
	if len(rep.Findings) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEVERITY\tLAYER\tSUBJECT\tFINDING")
		for _, f := range rep.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Severity, f.Layer, f.Subject, f.Message)
		}
		tw.Flush()
	}
	verdict := "coherent"
	if !rep.Coherent {
		verdict = fmt.Sprintf("INCOHERENT: %d problems", rep.Problems())
	}
	fmt.Fprintf(w, "%s (routing sequence %d; checked", verdict, rep.RoutingSeq)
	for _, l := range []string{doctor.LayerDeploys, doctor.LayerInstances, doctor.LayerMachines, doctor.LayerRouting, doctor.LayerHosts,
		doctor.LayerGateways, doctor.LayerDNS, doctor.LayerMesh, doctor.LayerCerts, doctor.LayerLeases} {
		fmt.Fprintf(w, " %s %d", l, rep.Checked[l])
	}
	fmt.Fprintln(w, ")")
}
