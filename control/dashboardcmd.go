package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/dashboard"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// tokenCreated is `control dashboard token create`'s answer.
type tokenCreated struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	Token string `json:"token"`
}

func setupDashboardTokenCreate(fs *flag.FlagSet) func(*call) error {
	name := fs.String("name", "", "what the token is for (shown by ls)")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			tok, rec, err := dashboard.NewToken(*name)
			if err != nil {
				return err
			}
			if err := s.PutDashboardToken(c.ctx, rec); err != nil {
				return err
			}
			v := tokenCreated{ID: rec.ID, Name: rec.Name, Token: tok}
			return c.out.emit(v, func(w io.Writer) {
				fmt.Fprintf(w, "dashboard token %s (shown once; revoke with `control dashboard revoke %s`):\n%s\n", rec.ID, rec.ID, tok)
			})
		})
	}
}

func setupDashboardTokenList(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := s.ListDashboardTokens(c.ctx)
			if err != nil {
				return err
			}
			if list == nil {
				list = []store.DashboardToken{}
			}
			for i := range list {
				list[i].Hash = "" // nothing to show, nothing to leak
			}
			return c.out.emit(list, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tCREATED")
				for _, t := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, printers.Dash(t.Name), t.CreatedAt.Format(time.RFC3339))
				}
				tw.Flush()
			})
		})
	}
}

func setupDashboardTokenRemove(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			if err := s.DeleteDashboardToken(c.ctx, c.args[0]); err != nil {
				return err
			}
			fmt.Fprintf(c.out.w, "dashboard token %s revoked\n", c.args[0])
			return nil
		})
	}
}
