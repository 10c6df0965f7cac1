package status

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// Deploy is one namespace's status for `control deploy status`.
type Deploy struct {
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

// ReadDeploys reads the deploy status of the namespaces named, or of every
// namespace with a deploy when none is named. A namespace named that has
// no deploy is not_found; one not named is left out.
func ReadDeploys(ctx context.Context, s *store.Store, d *deploy.Deployer, named []string) (Deploys, error) {
	sums, err := fleet.Read(ctx, s)
	if err != nil {
		return nil, err
	}
	nss := named
	if len(nss) == 0 {
		var err error
		if nss, err = d.Namespaces(ctx); err != nil {
			return nil, err
		}
	}
	views := Deploys{}
	for _, ns := range nss {
		v := Deploy{Namespace: ns}
		sts, err := d.Statuses(ctx, ns)
		if err != nil {
			return nil, err
		}
		if len(sts) == 0 {
			if len(named) > 0 {
				return nil, store.Errorf(store.CodeNotFound, "namespace %s has no deploys", ns).With("namespace", ns)
			}
			continue
		}
		v.Latest = &sts[len(sts)-1]
		if v.Phases, err = d.Phases(ctx, ns, v.Latest.DeployID); err != nil {
			return nil, err
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
	return views, nil
}

// Deploys is the status of several namespaces, in the order asked for.
type Deploys []Deploy

// WriteText writes each namespace's deploy status for a person, a blank
// line between them.
func (views Deploys) WriteText(w io.Writer) {
	for i, v := range views {
		if i > 0 {
			fmt.Fprintln(w)
		}
		v.writeText(w)
	}
}

func (v *Deploy) writeText(w io.Writer) {
	st := v.Latest
	fmt.Fprintf(w, "namespace %s\n", v.Namespace)
	if v.Live != nil {
		fmt.Fprintf(w, "  live:      %s revision %d (committed %s)\n", v.Live.ID, v.Live.Revision, v.Live.CreatedAt.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  live:      none\n")
	}
	fmt.Fprintf(w, "  latest:    %s revision %d: %s (phase %s)\n", st.DeployID, st.Revision, st.State, st.Phase)
	fmt.Fprintf(w, "  routing:   published=%v sequence=%d gateways=%s\n", st.RoutingPublished, st.RoutingSeq, printers.Dash(st.Gateways))
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
			if i == maxShown {
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
