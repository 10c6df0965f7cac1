package maintenance

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// List is every maintenance record, on or off, by namespace then service.
type List []store.MaintenanceRecord

// ReadList reads every maintenance record; reads only.
func ReadList(ctx context.Context, s *store.Store) (List, error) {
	recs, err := s.MaintenanceRecords(ctx)
	if err != nil {
		return nil, err
	}
	return List(recs), nil
}

// WriteText writes l as a table.
func (l List) WriteText(w io.Writer) {
	if len(l) == 0 {
		fmt.Fprintln(w, "nothing is or was under maintenance")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tMAINTENANCE\tRETRY AFTER\tSET BY\tMESSAGE")
	for _, r := range l {
		svc, state, retry, msg := r.Service, "off", "-", "-"
		if svc == "" {
			svc = "(all)"
		}
		if r.On {
			state, retry = "on", time.Duration(r.RetryAfter).String()
			if r.Message != "" {
				msg = r.Message
			}
		}
		by := r.At.Local().Format(time.DateTime)
		if r.By != "" {
			by = r.By + " " + by
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, svc, state, retry, by, msg)
	}
	tw.Flush()
}

// WriteText says what the change did.
func (c *Change) WriteText(w io.Writer) {
	what := c.Record.Namespace
	if c.Record.Service != "" {
		what += "/" + c.Record.Service
	}
	if !c.Changed {
		state := "not under maintenance"
		if c.Previous {
			state = "under maintenance already"
		}
		fmt.Fprintf(w, "%s is %s; nothing changed\n", what, state)
		return
	}
	if c.Record.On {
		fmt.Fprintf(w, "%s is under maintenance: every gateway answers 503 (Retry-After %s), its instances untouched; routing sequence %d\n",
			what, time.Duration(c.Record.RetryAfter), c.Seq)
	} else {
		fmt.Fprintf(w, "%s is out of maintenance: served by its instances again; routing sequence %d\n", what, c.Seq)
	}
	if c.Gateways != "" {
		fmt.Fprintf(w, "%s gateways applied it\n", c.Gateways)
	}
	for _, g := range c.Laggards {
		fmt.Fprintf(w, "warning: gateway %s has not applied routing sequence %d\n", g, c.Seq)
	}
}
