package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
)

func cmdMachine(ctx context.Context, args []string, stdout io.Writer) (*output, error) {
	if len(args) == 0 {
		return nil, usagef("want a subcommand: invite, ls, drain ID, disable ID, enable ID")
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("control machine "+sub, stdout)
	switch sub {
	case "invite":
		c := addClientFlags(fs, true)
		c.mutating = true
		region := fs.String("region", "", "region of the machine that redeems the invite")
		labels := labelFlags{}
		fs.Var(labels, "label", "label k=v of the machine (repeatable)")
		ttl := fs.Duration("ttl", store.DefaultInviteTTL, "how long the invite stays redeemable")
		if _, err := parse(fs, args); err != nil {
			return nil, err
		}
		s, err := c.open(ctx)
		if err != nil {
			return c.output(stdout), err
		}
		defer s.NC.Close()
		token, inv, err := s.CreateInvite(ctx, *region, labels, *ttl)
		if err != nil {
			return c.output(stdout), err
		}
		out := c.output(stdout)
		return out, out.emit(map[string]any{"token": token, "expires_at": inv.ExpiresAt, "region": inv.Region, "labels": inv.Labels},
			func(w io.Writer) { fmt.Fprintln(w, token) })
	case "ls", "list":
		c := addClientFlags(fs, true)
		probe := fs.Duration("probe-timeout", time.Second, "how long each machine has to answer the reachability probe")
		if _, err := parse(fs, args); err != nil {
			return nil, err
		}
		s, err := c.open(ctx)
		if err != nil {
			return c.output(stdout), err
		}
		defer s.NC.Close()
		list, err := machines.List(ctx, s, *probe)
		if err != nil {
			return c.output(stdout), err
		}
		out := c.output(stdout)
		return out, out.emit(list, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MACHINE\tREGION\tLABELS\tSTATE\tADDRESS\tREACHABLE\tINSTANCES")
			for _, m := range list {
				reach := "yes (" + m.RTT + ")"
				inst := fmt.Sprint(m.Instances)
				if !m.Reachable {
					reach, inst = "no: "+shortCause(m.Problem), "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, dash(m.Region), labelsText(m.Labels), m.State, m.Address, reach, inst)
			}
			tw.Flush()
		})
	case "drain", "disable", "enable":
		c := addClientFlags(fs, true)
		c.mutating = true
		pos, err := parse(fs, args)
		if err != nil {
			return nil, err
		}
		if len(pos) != 1 {
			return nil, usagef("want exactly one machine ID")
		}
		s, err := c.open(ctx)
		if err != nil {
			return c.output(stdout), err
		}
		defer s.NC.Close()
		state := map[string]string{"drain": store.MachineDraining, "disable": store.MachineDisabled, "enable": store.MachineActive}[sub]
		rec, err := machines.SetState(ctx, s, pos[0], state)
		out := c.output(stdout)
		if err != nil {
			return out, err
		}
		return out, out.emit(rec, func(w io.Writer) { fmt.Fprintf(w, "machine %s is %s\n", rec.ID, rec.State) })
	}
	return nil, usagef("unknown subcommand %q: want invite, ls, drain, disable or enable", sub)
}

func shortCause(p string) string {
	for _, c := range []string{store.CauseNoResponders, store.CauseTimeout, store.CauseTransport} {
		if strings.Contains(p, c) {
			return c
		}
	}
	return p
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func labelsText(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
