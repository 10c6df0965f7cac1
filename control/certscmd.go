package main

import (
	"context"
	"flag"
	"io"

	"github.com/edgeplane/edgeplane/certs"
	"github.com/edgeplane/edgeplane/control/printers"
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
	return out.emit(list, func(w io.Writer) { printers.Certs(w, list) })
}
