package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/store"
)

func setupCerts(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error { return listCerts(c.ctx, s, c.out) })
	}
}

func listCerts(ctx context.Context, s *store.Store, out *output) error {
	list, err := certs.ListStatus(ctx, s)
	if err != nil {
		return err
	}
	if list == nil {
		list = []certs.Status{}
	}
	return out.emit(list, func(w io.Writer) {
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
