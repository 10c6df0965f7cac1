package printers

import (
	"fmt"
	"io"

	"github.com/edgeplane/edgeplane/control/doctor"
)

// Doctor writes doctor's findings and its verdict, with how much of each
// layer it checked.
func Doctor(w io.Writer, rep *doctor.Report) {
	if len(rep.Findings) > 0 {
		tw := table(w)
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
		doctor.LayerGateways, doctor.LayerDNS, doctor.LayerMesh, doctor.LayerCerts, doctor.LayerLeases, doctor.LayerRegions} {
		fmt.Fprintf(w, " %s %d", l, rep.Checked[l])
	}
	fmt.Fprintln(w, ")")
}
