package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/pki"
)

func setupMachineInvite(fs *flag.FlagSet) func(*call) error {
	region := fs.String("region", "", "region of the machine that redeems the invite")
	labels := labelFlags{}
	fs.Var(labels, "label", "label k=v of the machine (repeatable)")
	ttl := fs.Duration("ttl", invites.DefaultTTL, "how long the invite stays redeemable")
	address := fs.String("address", "", "the only address the machine may be admitted at (needed for a loopback address on a store other boxes reach)")
	storeURLs := fs.String("store", "", "the storage nodes' URLs a joining box reaches, comma-separated (tls://10.0.0.1:4222,...): named in the invite, `control join` needs no --nats")
	return func(c *call) error {
		// A joining box checks the storage node it enrolls with against
		// the CAs this CLI verifies storage nodes against.
		cas, err := c.client.FleetCAs()
		if err != nil {
			return err
		}
		var fingerprints []string
		for _, ca := range cas {
			fingerprints = append(fingerprints, pki.Fingerprint(ca))
		}
		return c.withStore(func(s *store.Store) error {
			token, inv, err := invites.Create(c.ctx, s, invites.Spec{Region: *region, Labels: labels, Address: *address, TTL: *ttl})
			if err != nil {
				return err
			}
			token = invites.WithStore(invites.WithCAs(token, fingerprints), splitList(*storeURLs))
			return c.out.emit(map[string]any{"token": token, "expires_at": inv.ExpiresAt, "region": inv.Region, "labels": inv.Labels, "address": inv.Address},
				func(w io.Writer) { fmt.Fprintln(w, token) })
		})
	}
}

func setupMachineList(fs *flag.FlagSet) func(*call) error {
	probe := fs.Bool("probe", false, "also ask every machine now (one call each) instead of reading only what agents last wrote")
	timeout := fs.Duration("probe-timeout", time.Second, "with --probe: how long each machine has to answer")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			list, err := machines.List(c.ctx, s, *probe, *timeout)
			if err != nil {
				return err
			}
			if list == nil {
				list = []machines.Listed{}
			}
			return c.out.emit(list, func(w io.Writer) { printers.Machines(w, list, *probe) })
		})
	}
}

// setupMachineState is drain, disable and enable: each sets the machine's
// state.
func setupMachineState(state string) func(*flag.FlagSet) func(*call) error {
	return func(*flag.FlagSet) func(*call) error {
		return func(c *call) error {
			return c.withStore(func(s *store.Store) error {
				rec, err := machines.SetState(c.ctx, s, c.args[0], state)
				if err != nil {
					return err
				}
				return c.out.emit(rec, func(w io.Writer) { fmt.Fprintf(w, "machine %s is %s\n", rec.ID, rec.State) })
			})
		}
	}
}

// setupMachineAddress is the operator's move of a machine: the only one
// to an address other than the machine's mesh IP (an agent's credentials
// may ask for that one alone).
func setupMachineAddress(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			mv, err := machines.SetAddress(c.ctx, s, c.args[0], c.args[1])
			if err != nil {
				return err
			}
			return c.out.emit(mv, func(w io.Writer) { printers.Moved(w, mv) })
		})
	}
}

func setupMachineRemove(fs *flag.FlagSet) func(*call) error {
	force := fs.Bool("force", false, "remove a machine that is dead (or stolen) though it still has instances; they leave the routing and the next apply replaces them elsewhere")
	probe := fs.Duration("probe-timeout", 2*time.Second, "how long the machine has to answer before it counts as dead")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			rm, err := machines.Remove(c.ctx, s, c.args[0], *force, *probe)
			if err != nil {
				return err
			}
			return c.out.emit(rm, func(w io.Writer) { printers.Removed(w, rm) })
		})
	}
}
