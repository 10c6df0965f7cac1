package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/certs"
)

func cmdCerts(ctx context.Context, args []string, stdout io.Writer) (*output, error) {
	fs := newFlagSet("control certs", stdout)
	c := addClientFlags(fs, true)
	if _, err := parse(fs, args); err != nil {
		return nil, err
	}
	out := c.output(stdout)
	s, err := c.open(ctx)
	if err != nil {
		return out, err
	}
	defer s.NC.Close()
	list, err := certs.ListStatus(ctx, s)
	if err != nil {
		return out, err
	}
	if list == nil {
		list = []certs.Status{}
	}
	return out, out.emit(list, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST\tISSUER\tEXPIRES\tLAST ATTEMPT\tNEXT ATTEMPT\tFAILURES\tLAST ERROR")
		for _, st := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", st.Host, dash(st.Issuer), when(st.Expiry), when(st.LastAttempt),
				when(st.NextAttempt), st.Failures, dash(st.LastError))
		}
		tw.Flush()
	})
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
