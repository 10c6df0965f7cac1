package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

func cmdDeploy(ctx context.Context, args []string, stdout io.Writer) (*output, error) {
	if len(args) == 0 {
		return nil, usagef("want a subcommand: preview, apply, status, history, rollback")
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("control deploy "+sub, stdout)
	c := addClientFlags(fs, true)
	c.mutating = sub == "apply" || sub == "rollback"
	var opts deploy.Options
	var file, to *string
	switch sub {
	case "preview", "apply", "rollback":
		if sub != "rollback" {
			file = fs.String("f", "", "manifest file, YAML or JSON (required)")
		} else {
			to = fs.String("to", "", "deploy ID of the commit to roll back to (default: the one before the live commit)")
		}
		if sub != "preview" {
			fs.DurationVar(&opts.LeaseTTL, "lease-ttl", 10*time.Second, "TTL of the namespace deploy lease (renewed while held)")
			fs.DurationVar(&opts.ProbeTimeout, "probe-timeout", 2*time.Second, "how long each machine has to answer the capacity probe")
			fs.DurationVar(&opts.GatewayWait, "gateway-wait", 10*time.Second, "bound on waiting for gateways to apply the new routing")
			fs.DurationVar(&opts.DrainGrace, "drain-grace", 2*time.Second, "pause before stopping old instances, for requests in flight")
			fs.DurationVar(&opts.StopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace for old instances")
		}
	case "status", "history":
	default:
		return nil, usagef("unknown subcommand %q: want preview, apply, status, history or rollback", sub)
	}
	pos, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	out := c.output(stdout)
	var m *store.Manifest
	if file != nil {
		if *file == "" {
			return out, usagef("-f FILE is required")
		}
		// An invalid manifest fails here, before anything connects or writes.
		if m, err = manifest.ReadFile(*file); err != nil {
			if me, ok := err.(*manifest.Error); ok {
				return out, me.Structured()
			}
			return out, err
		}
	}
	s, err := c.open(ctx)
	if err != nil {
		return out, err
	}
	defer s.NC.Close()
	if !out.json {
		opts.Out = stdout
	}
	d := deploy.New(s, opts)
	switch sub {
	case "preview":
		p, err := d.Preview(ctx, m)
		if err != nil && p == nil {
			return out, err
		}
		if perr := out.emit(p, func(w io.Writer) { printPlan(w, p) }); perr != nil {
			return out, perr
		}
		return out, err
	case "apply":
		st, err := d.Apply(ctx, m)
		return out, finishApply(out, st, err)
	case "rollback":
		if len(pos) != 1 {
			return out, usagef("want the namespace")
		}
		st, err := d.Rollback(ctx, pos[0], *to)
		return out, finishApply(out, st, err)
	case "status":
		return out, deployStatus(ctx, d, out, pos)
	case "history":
		if len(pos) != 1 {
			return out, usagef("want the namespace")
		}
		hist, err := d.History(ctx, pos[0])
		if err != nil {
			return out, err
		}
		if hist == nil {
			hist = []store.DeployCommit{}
		}
		return out, out.emit(hist, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DEPLOY\tREVISION\tCOMMITTED\tSERVICES\tSLOTS\tNOTE")
			for _, h := range hist {
				note := ""
				if h.RollbackOf != "" {
					note = "rollback to " + h.RollbackOf
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", h.ID, h.Revision, h.CreatedAt.Format(time.RFC3339),
					strings.Join(slices.Sorted(maps.Keys(h.Manifest.Services)), ","), len(h.Slots), note)
			}
			tw.Flush()
		})
	}
	return out, nil
}

func finishApply(out *output, st *store.DeployStatus, err error) error {
	if out.json && st != nil {
		if perr := out.emit(st, nil); perr != nil {
			return perr
		}
	}
	if err != nil {
		return err
	}
	if !out.json {
		fmt.Fprintf(out.w, "deploy %s of %s is %s: revision %d, gateways %s\n", st.DeployID, st.Namespace, st.State, st.Revision, dash(st.Gateways))
	}
	return nil
}

func printPlan(w io.Writer, p *deploy.Plan) {
	start, keep, stop := p.Counts()
	live := p.LiveID
	if live == "" {
		live = "none"
	}
	fmt.Fprintf(w, "namespace %s: revision %d (live: %s): %d to start, %d to keep, %d to stop\n", p.Namespace, p.Revision, live, start, keep, stop)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tSERVICE\tSLOT\tINSTANCE\tMACHINE\tREASON")
	for _, a := range p.Actions {
		inst := a.InstanceID
		if a.Action == deploy.ActionStart {
			inst = "(new)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", a.Action, a.Service, a.Slot, inst, dash(a.Machine), a.Reason)
	}
	tw.Flush()
}

// statusView is one namespace's status for `control deploy status`.
type statusView struct {
	Namespace string              `json:"namespace"`
	Live      *store.DeployCommit `json:"live,omitempty"`
	LiveSeq   uint64              `json:"live_seq,omitempty"`
	Latest    *store.DeployStatus `json:"latest,omitempty"`
	Phases    []store.PhaseRecord `json:"phases,omitempty"`
}

func deployStatus(ctx context.Context, d *deploy.Deployer, out *output, pos []string) error {
	nss := pos
	if len(nss) == 0 {
		var err error
		if nss, err = d.Namespaces(ctx); err != nil {
			return err
		}
	}
	var views []statusView
	for _, ns := range nss {
		v := statusView{Namespace: ns}
		sts, err := d.Statuses(ctx, ns)
		if err != nil {
			return err
		}
		if len(sts) == 0 {
			if len(pos) > 0 {
				return store.Errorf(store.CodeNotFound, "namespace %s has no deploys", ns).With("namespace", ns)
			}
			continue
		}
		v.Latest = &sts[len(sts)-1]
		if v.Phases, err = d.Phases(ctx, ns, v.Latest.DeployID); err != nil {
			return err
		}
		if live, err := d.Live(ctx, ns); err == nil {
			v.Live, v.LiveSeq = live, live.Seq
		}
		views = append(views, v)
	}
	if views == nil {
		views = []statusView{}
	}
	return out.emit(views, func(w io.Writer) {
		for i, v := range views {
			if i > 0 {
				fmt.Fprintln(w)
			}
			st := v.Latest
			fmt.Fprintf(w, "namespace %s\n", v.Namespace)
			if v.Live != nil {
				fmt.Fprintf(w, "  live:      %s revision %d (committed %s)\n", v.Live.ID, v.Live.Revision, v.Live.CreatedAt.Format(time.RFC3339))
			} else {
				fmt.Fprintf(w, "  live:      none\n")
			}
			fmt.Fprintf(w, "  latest:    %s revision %d: %s (phase %s)\n", st.DeployID, st.Revision, st.State, st.Phase)
			fmt.Fprintf(w, "  routing:   published=%v sequence=%d gateways=%s\n", st.RoutingPublished, st.RoutingSeq, dash(st.Gateways))
			if st.Error != nil {
				fmt.Fprintf(w, "  error:     %s: %s\n", st.Error.Code, st.Error.Message)
			}
			for _, c := range st.Cleanup {
				fmt.Fprintf(w, "  cleanup:   %s on %s: %s (recoverable)\n", c.InstanceID, c.Machine, c.Error)
			}
			for _, wn := range st.Warnings {
				fmt.Fprintf(w, "  warning:   %s\n", wn)
			}
			for _, p := range v.Phases {
				fmt.Fprintf(w, "  [%d] %-17s %-8s %s\n", p.Index, p.Name, p.State, p.Detail)
			}
		}
	})
}

func cmdInstances(ctx context.Context, args []string, stdout io.Writer) (*output, error) {
	fs := newFlagSet("control instances", stdout)
	c := addClientFlags(fs, true)
	ns := fs.String("namespace", "", "only this namespace")
	if _, err := parse(fs, args); err != nil {
		return nil, err
	}
	out := c.output(stdout)
	s, err := c.open(ctx)
	if err != nil {
		return out, err
	}
	defer s.NC.Close()
	filter := store.NamespaceInstancesFilter("*")
	if *ns != "" {
		filter = store.NamespaceInstancesFilter(*ns)
	}
	list := []store.InstanceRecord{}
	err = store.ListJSON(ctx, s.Instances, filter, func(_ string, r *store.InstanceRecord) error {
		list = append(list, *r)
		return nil
	})
	if err != nil {
		return out, err
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		return a.ID < b.ID
	})
	return out, out.emit(list, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tSLOT\tINSTANCE\tREVISION\tMACHINE\tADDRESS\tSTATE\tERROR")
		for _, r := range list {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s:%d\t%s\t%s\n", r.Namespace, r.Service, r.Slot, r.ID, r.Revision, r.Machine, r.Address, r.Port, r.State, dash(r.Error))
		}
		tw.Flush()
	})
}
