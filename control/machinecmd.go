package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/machines"
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
			token = invites.WithCAs(token, fingerprints)
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
			return c.out.emit(list, func(w io.Writer) { printMachines(w, list, *probe) })
		})
	}
}

func printMachines(w io.Writer, list []machines.Listed, probed bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "MACHINE\tREGION\tLABELS\tSTATE\tADDRESS\tLIVENESS\tINSTANCES\tFREE"
	if probed {
		head += "\tREACHABLE"
	}
	fmt.Fprintln(tw, head)
	now := time.Now()
	for _, m := range list {
		live := m.Liveness
		if !m.LastBeat.IsZero() {
			live += " (" + now.Sub(m.LastBeat).Round(time.Second).String() + " ago)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d", m.ID, dash(m.Region), labelsText(m.Labels), m.State, m.Address, live, m.Instances, m.Free)
		if probed {
			reach := "yes (" + m.RTT + ")"
			if !m.Reachable {
				reach = "no: " + shortCause(m.Problem)
			}
			fmt.Fprintf(tw, "\t%s", reach)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
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
			return c.out.emit(mv, func(w io.Writer) {
				if mv.From == mv.Address {
					fmt.Fprintf(w, "machine %s stays at %s\n", mv.ID, mv.Address)
				} else {
					fmt.Fprintf(w, "machine %s moved from %s to %s\n", mv.ID, mv.From, mv.Address)
				}
				if len(mv.Republished) > 0 {
					fmt.Fprintf(w, "  routing published again for %s\n", strings.Join(mv.Republished, ", "))
				}
				fmt.Fprintf(w, "  instances listen where they were started: restart the machine's agent, then apply its namespaces again\n")
			})
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
			return c.out.emit(rm, func(w io.Writer) {
				fmt.Fprintf(w, "machine %s removed", rm.Machine)
				if !rm.Reachable {
					fmt.Fprint(w, " (it did not answer)")
				}
				fmt.Fprintln(w)
				if len(rm.Instances) > 0 {
					fmt.Fprintf(w, "  forgot %d instances: %s\n", len(rm.Instances), strings.Join(rm.Instances, ", "))
					fmt.Fprintf(w, "  routing published again for %s; the next apply of each namespace places replacements\n", strings.Join(rm.Republished, ", "))
				}
				if rm.MeshIP != "" {
					fmt.Fprintf(w, "  left the mesh, releasing %s\n", rm.MeshIP)
				}
				if rm.Invites > 0 {
					fmt.Fprintln(w, "  its invite is void")
				}
				fmt.Fprintf(w, "  revoked %d recorded credentials (control creds ls --machine %s); credentials issued without a record still work until revoked: control creds revoke --user-creds FILE\n",
					rm.Credentials, rm.Machine)
			})
		})
	}
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
