package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/store"
)

// addApplyFlags registers the flags of the commands that run an apply.
func addApplyFlags(fs *flag.FlagSet) *deploy.Options {
	opts := &deploy.Options{}
	fs.DurationVar(&opts.LeaseTTL, "lease-ttl", 10*time.Second, "TTL of the namespace deploy lease (renewed while held)")
	fs.DurationVar(&opts.ProbeTimeout, "probe-timeout", 2*time.Second, "how long each machine has to answer the capacity probe")
	fs.DurationVar(&opts.GatewayWait, "gateway-wait", 10*time.Second, "bound on waiting for gateways to apply the new routing")
	fs.DurationVar(&opts.DrainGrace, "drain-grace", 2*time.Second, "pause before stopping old instances, for requests in flight")
	fs.DurationVar(&opts.StopGrace, "stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace for old instances")
	fs.DurationVar(&opts.RPCTimeout, "rpc-timeout", 10*time.Second, "bound on each machine call beyond its own wait; a machine with candidates that stops answering fails the apply within about this")
	return opts
}

// addManifestFlag registers -f; read reads and validates the manifest it
// names, so that an invalid one fails before anything connects or writes.
func addManifestFlag(fs *flag.FlagSet) (read func() (*store.Manifest, error)) {
	file := fs.String("f", "", "manifest file, YAML or JSON (required)")
	return func() (*store.Manifest, error) {
		if *file == "" {
			return nil, usagef("-f FILE is required")
		}
		m, err := manifest.ReadFile(*file)
		if me, ok := err.(*manifest.Error); ok {
			return nil, me.Structured()
		}
		return m, err
	}
}

// withDeployer binds to the store for as long as fn runs, with a Deployer
// that prints its progress on stdout (unless the output is JSON).
func (c *call) withDeployer(opts deploy.Options, fn func(*deploy.Deployer) error) error {
	if !c.out.json {
		opts.Out = c.stdout
	}
	return c.withStore(func(s *store.Store) error { return fn(deploy.New(s, opts)) })
}

func setupDeployPreview(fs *flag.FlagSet) func(*call) error {
	read := addManifestFlag(fs)
	return func(c *call) error {
		m, err := read()
		if err != nil {
			return err
		}
		return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
			p, err := d.Preview(c.ctx, m)
			if err != nil && p == nil {
				return err
			}
			if perr := c.out.emit(p, func(w io.Writer) { printPlan(w, p) }); perr != nil {
				return perr
			}
			return err
		})
	}
}

func setupDeployApply(fs *flag.FlagSet) func(*call) error {
	read := addManifestFlag(fs)
	opts := addApplyFlags(fs)
	return func(c *call) error {
		m, err := read()
		if err != nil {
			return err
		}
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Apply(c.ctx, m)
			return finishApply(c.out, st, err)
		})
	}
}

func setupDeployRollback(fs *flag.FlagSet) func(*call) error {
	to := fs.String("to", "", "deploy ID of the commit to roll back to (default: the one before the live commit)")
	opts := addApplyFlags(fs)
	return func(c *call) error {
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Rollback(c.ctx, c.args[0], *to)
			return finishApply(c.out, st, err)
		})
	}
}

func setupDeployDestroy(fs *flag.FlagSet) func(*call) error {
	opts := addApplyFlags(fs)
	return func(c *call) error {
		return c.withDeployer(*opts, func(d *deploy.Deployer) error {
			st, err := d.Destroy(c.ctx, c.args[0])
			return finishApply(c.out, st, err)
		})
	}
}

func setupCanaryDecision(action string) func(*flag.FlagSet) func(*call) error {
	return func(*flag.FlagSet) func(*call) error {
		return func(c *call) error {
			return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
				st, err := d.DecideCanary(c.ctx, c.args[0], action)
				if err != nil {
					return err
				}
				return c.out.emit(st, func(w io.Writer) {
					fmt.Fprintf(w, "%s of the canary of deploy %s (revision %d) recorded; the apply holding it acts within %s (the control plane, if its orchestrator is gone)\n",
						action, st.DeployID, st.Revision, deploy.CanaryPoll)
				})
			})
		}
	}
}

func setupDeployStatus(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error {
			return deployStatus(c.ctx, s, deploy.New(s, deploy.Options{}), c.out, c.args)
		})
	}
}

func setupDeployHistory(*flag.FlagSet) func(*call) error {
	return func(c *call) error {
		return c.withDeployer(deploy.Options{}, func(d *deploy.Deployer) error {
			hist, refused, err := d.History(c.ctx, c.args[0])
			if err != nil {
				return err
			}
			// Commits nobody trusted signed are not history: say so
			// beside it.
			for _, r := range refused {
				fmt.Fprintf(c.stderr, "warning: left out: %v\n", r)
			}
			if hist == nil {
				hist = []store.DeployCommit{}
			}
			return c.out.emit(hist, func(w io.Writer) { printHistory(w, hist) })
		})
	}
}

func printHistory(w io.Writer, hist []store.DeployCommit) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEPLOY\tREVISION\tCOMMITTED\tSERVICES\tSLOTS\tNOTE")
	for _, h := range hist {
		note := ""
		switch {
		case h.Destroy:
			note = "destroy"
		case h.RollbackOf != "":
			note = "rollback to " + h.RollbackOf
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", h.ID, h.Revision, h.CreatedAt.Format(time.RFC3339),
			strings.Join(slices.Sorted(maps.Keys(h.Manifest.Services)), ","), len(h.Slots), note)
	}
	tw.Flush()
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
	// Instances counts the latest deploy's instances, Machines the
	// namespace's instances per machine, from the fleet status.
	Instances *store.Counts           `json:"instances,omitempty"`
	Machines  map[string]store.Counts `json:"machines,omitempty"`
	// Traffic is each service's traffic as the gateways report it.
	Traffic map[string]store.ServiceTrafficStatus `json:"traffic,omitempty"`
}

// maxMachinesShown bounds the machines deploy status names in text.
const maxMachinesShown = 10

func deployStatus(ctx context.Context, s *store.Store, d *deploy.Deployer, out *output, pos []string) error {
	sums, err := fleet.Read(ctx, s)
	if err != nil {
		return err
	}
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
		if sum, ok := sums[ns]; ok {
			if c, ok := sum.Deploys[v.Latest.DeployID]; ok {
				v.Instances = &c
			}
			v.Machines, v.Traffic = sum.Machines, sum.Traffic
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
			for _, c := range st.Canary {
				fmt.Fprintf(w, "  canary:    step %d %d%% hold %s: %s", c.Step, c.Weight, c.Hold, c.Verdict)
				if c.Reason != "" {
					fmt.Fprintf(w, ": %s", c.Reason)
				}
				fmt.Fprintln(w)
				for _, f := range c.Judged {
					fmt.Fprintf(w, "             %s: %s\n", f.Service, canaryLine(f))
				}
			}
			if c := v.Instances; c != nil {
				fmt.Fprintf(w, "  instances: %d ready, %d starting, %d backoff, %d failed, %d stale\n", c.Ready, c.Starting, c.Backoff, c.Failed, c.Stale)
			}
			if len(v.Machines) > 0 {
				var behind []string
				for _, m := range slices.Sorted(maps.Keys(v.Machines)) {
					if c := v.Machines[m]; c.Ready != c.Total() {
						behind = append(behind, fmt.Sprintf("%s (%d of %d ready)", m, c.Ready, c.Total()))
					}
				}
				fmt.Fprintf(w, "  machines:  %d, %d with all instances ready\n", len(v.Machines), len(v.Machines)-len(behind))
				for i, b := range behind {
					if i == maxMachinesShown {
						fmt.Fprintf(w, "             and %d more\n", len(behind)-i)
						break
					}
					fmt.Fprintf(w, "             %s\n", b)
				}
			}
			for _, svc := range slices.Sorted(maps.Keys(v.Traffic)) {
				t := v.Traffic[svc]
				fmt.Fprintf(w, "  traffic:   %s: %s\n", svc, trafficLine(t.TrafficFigures))
				for _, gw := range slices.Sorted(maps.Keys(t.Gateways)) {
					fmt.Fprintf(w, "             via %s: %s\n", gw, trafficLine(t.Gateways[gw]))
				}
			}
		}
	})
}

func setupInstances(fs *flag.FlagSet) func(*call) error {
	ns := fs.String("namespace", "", "only this namespace")
	return func(c *call) error {
		return c.withStore(func(s *store.Store) error { return listInstances(c.ctx, s, *ns, c.out) })
	}
}

func listInstances(ctx context.Context, s *store.Store, ns string, out *output) error {
	filter := store.NamespaceInstancesFilter("*")
	if ns != "" {
		filter = store.NamespaceInstancesFilter(ns)
	}
	list := []store.InstanceRecord{}
	err := s.ListInstances(ctx, filter, func(_ string, r *store.InstanceRecord) error {
		list = append(list, *r)
		return nil
	})
	if err != nil {
		return err
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
	return out.emit(list, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tSLOT\tINSTANCE\tREVISION\tMACHINE\tADDRESS\tSTATE\tRESTARTS\tLAST EXIT\tERROR")
		for _, r := range list {
			lastExit := "-"
			if r.LastExit != "" {
				lastExit = r.LastExit + " (" + r.LastExitAt.UTC().Format(time.RFC3339) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s:%d\t%s\t%d\t%s\t%s\n", r.Namespace, r.Service, r.Slot, r.ID, r.Revision,
				r.Machine, r.Address, r.Port, r.State, r.Restarts, lastExit, dash(r.Error))
		}
		tw.Flush()
	})
}

// setupInstanceCommand is `instance restart` and `instance stop`: a leased
// command to the machine that runs the instance. Its attempt
// number is the time in milliseconds, so a later command always wins over
// an earlier one still in flight.
func setupInstanceCommand(command string) func(*flag.FlagSet) func(*call) error {
	return func(fs *flag.FlagSet) func(*call) error {
		grace := fs.Duration("stop-grace", 10*time.Second, "SIGTERM-to-SIGKILL grace")
		timeout := fs.Duration("wait", 2*time.Minute, "how long the machine has to finish (a restart waits for readiness)")
		return func(c *call) error {
			return c.withStore(func(s *store.Store) error {
				rec, err := findInstance(c.ctx, s, c.args[0])
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(c.ctx, *timeout)
				defer cancel()
				var rep store.LeasedReply
				err = s.Call(ctx, rec.Machine, command, store.LeasedCommand{InstanceID: rec.ID, Namespace: rec.Namespace, Service: rec.Service,
					Attempt: int(time.Now().UnixMilli()), Grace: store.Duration(*grace)}, &rep)
				if err != nil {
					return err
				}
				return c.out.emit(rep, func(w io.Writer) {
					fmt.Fprintf(w, "instance %s (%s/%s) on %s: %s\n", rec.ID, rec.Namespace, rec.Service, rec.Machine, rep.Detail)
				})
			})
		}
	}
}

// findInstance finds an instance record by ID alone.
func findInstance(ctx context.Context, s *store.Store, id string) (*store.InstanceRecord, error) {
	if !store.ValidToken(id) {
		return nil, store.Errorf(store.CodeInvalid, "instance id %q: letters, digits, '-' and '_' only", id)
	}
	var found *store.InstanceRecord
	err := s.ListInstances(ctx, "*.*."+id, func(_ string, r *store.InstanceRecord) error {
		found = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, store.Errorf(store.CodeNotFound, "no instance %s", id).With("instance", id)
	}
	return found, nil
}

// canaryLine shows one service's canary figures, new revision first.
func canaryLine(f store.CanaryFigures) string {
	side := func(t store.RevisionTotals) string {
		return fmt.Sprintf("revision %d %d requests, %d 5xx (%.2f%%), p99 %s", t.Revision, t.Requests, t.Errors, 100*t.ErrorRatio,
			time.Duration(t.P99*float64(time.Second)).Round(100*time.Microsecond))
	}
	line := side(f.New) + " | " + side(f.Old)
	if len(f.Votes) > 0 {
		against := 0
		for _, v := range f.Votes {
			if v.Breach {
				against++
			}
		}
		line += fmt.Sprintf(" | %d gateway votes, %d past a limit", len(f.Votes), against)
	}
	return line
}
