package printers

import (
	"fmt"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/certs"
)

// Certs writes the certificates with their last renewal attempt.
func Certs(w io.Writer, list []certs.Status) {
	tw := table(w)
	fmt.Fprintln(tw, "HOST\tISSUER\tEXPIRES\tLAST ATTEMPT\tNEXT ATTEMPT\tFAILURES\tLAST ERROR")
	for _, st := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", st.Host, Dash(st.Issuer), when(st.Expiry), when(st.LastAttempt),
			when(st.NextAttempt), st.Failures, Dash(st.LastError))
	}
	tw.Flush()
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
