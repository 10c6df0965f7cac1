package fleetsim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/deploy"
	"github.com/edgeplane/edgeplane/store"
)

// LoadSpec is one fleet load run (the fleet load figures of BENCHMARKS.md): a fleet of
// Machines with Namespaces deployments of PerNamespace instances, whose
// instance states change at Rate writes per second for Duration, with
// Gateways routing projections following, and Applies deploys measured
// from their final commit to every gateway's view before the churn and
// again during it.
type LoadSpec struct {
	Machines     int
	Namespaces   int
	PerNamespace int
	Rate         int
	// Burst changes up to Burst instances of one machine at a time (see
	// Churn).
	Burst    int
	Duration time.Duration
	Gateways int
	Applies  int
	// Beat is the simulated agents' heartbeat interval.
	Beat time.Duration
	// Dialer opens each agent's and gateway's own connection.
	Dialer *Dialer
	// Midway, if set, is called halfway through the churn (a storage
	// node killed, say) and its result reported.
	Midway func() string
	// OnChurn, if set, is told when the writes start (true) and end.
	OnChurn func(started bool)
	// OnAgents, if set, is told when the agents start connecting (true)
	// and when every one has connected and reported in: the admission
	// phase, whose cost per connection a storage node is measured by.
	OnAgents func(started bool)
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// LoadReport is what a load run measured.
type LoadReport struct {
	StartAgents time.Duration
	Churn       ChurnResult
	// StatusLag: from a write sent to the first summary counting it.
	StatusLag []time.Duration
	Unseen    int
	// LagWindows are the status lags of the writes sent in each tenth of
	// the churn: how the lag moved (around a storage node's death, say).
	LagWindows []LagWindow
	// CommitLagIdle and CommitLagBusy: from a final commit to each
	// gateway's view applying its routing, without and with the churn.
	CommitLagIdle, CommitLagBusy []time.Duration
	// Midway is what Midway said.
	Midway string
	// ApplyErrors are the applies during the churn that failed (one that
	// meets a storage node's failover fails unavailable; the control
	// server's completer finishes or cleans up after it).
	ApplyErrors []string
	// Lost is the error of Verify, SummaryErr that of VerifySummaries.
	Lost, SummaryErr error
}

// RunLoad runs spec against the store s (control credentials), whose
// control plane (a `control server`, or the caller's aggregator and
// republish service) is running.
func RunLoad(ctx context.Context, s *store.Store, spec LoadSpec) (*LoadReport, error) {
	logf := func(format string, args ...any) {
		if spec.Log != nil {
			fmt.Fprintf(spec.Log, format+"\n", args...)
		}
	}
	rep := &LoadReport{}
	// Enrolment (machine records, credentials) is not a start: a box
	// comes up with its credentials. What is timed is the agents
	// connecting, each with its own credentials, and reporting in.
	cfg := Config{Machines: spec.Machines, Beat: spec.Beat, Dial: spec.Dialer.Agent, Enrolled: true}
	start := time.Now()
	if err := Enroll(ctx, s, cfg, spec.Dialer.PrepareAgent); err != nil {
		return nil, err
	}
	logf("%d machines enrolled in %s (records written, credentials issued; not counted below)", spec.Machines, time.Since(start).Round(time.Millisecond))
	if spec.OnAgents != nil {
		spec.OnAgents(true)
	}
	start = time.Now()
	f, err := Start(ctx, s, cfg)
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	rep.StartAgents = time.Since(start)
	if spec.OnAgents != nil {
		spec.OnAgents(false)
	}
	logf("%d simulated agents started in %s (connected with their own credentials, heartbeat and state written)", spec.Machines, rep.StartAgents.Round(time.Millisecond))
	var gws *Gateways
	if spec.Gateways > 0 {
		if gws, err = StartGateways(ctx, spec.Gateways, spec.Dialer.Gateway); err != nil {
			return nil, err
		}
		defer gws.Stop()
		logf("%d simulated gateways started", spec.Gateways)
	}
	if err := f.Place(ctx, spec.Namespaces, spec.PerNamespace); err != nil {
		return nil, err
	}
	logf("%d namespaces of %d instances placed", spec.Namespaces, spec.PerNamespace)
	if err := VerifySummaries(ctx, s, time.Minute); err != nil {
		return nil, err
	}

	ap := &applier{s: s, gws: gws}
	if gws != nil {
		for i := range spec.Applies {
			lags, err := ap.apply(ctx, i)
			if err != nil {
				return nil, err
			}
			logf("apply %d (idle): %s", i, ap.describe(lags))
			rep.CommitLagIdle = append(rep.CommitLagIdle, lags...)
		}
	}

	meter, err := NewLagMeter(ctx, s)
	if err != nil {
		return nil, err
	}
	defer meter.Stop()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if gws != nil && spec.Applies > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			every := spec.Duration / time.Duration(spec.Applies+1)
			for i := range spec.Applies {
				select {
				case <-cctx.Done():
					return
				case <-time.After(every):
				}
				// Once started, an apply runs to its end.
				lags, err := ap.apply(ctx, spec.Applies+i)
				if err != nil {
					rep.ApplyErrors = append(rep.ApplyErrors, err.Error())
					logf("apply %d failed: %v", spec.Applies+i, err)
					continue
				}
				logf("apply %d (during the writes): %s", spec.Applies+i, ap.describe(lags))
				rep.CommitLagBusy = append(rep.CommitLagBusy, lags...)
			}
		}()
	}
	churnStart := time.Now()
	if spec.Midway != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-cctx.Done():
			case <-time.After(spec.Duration / 2):
				rep.Midway = fmt.Sprintf("%s (%.1fs into the writes)", spec.Midway(), time.Since(churnStart).Seconds())
				logf("midway: %s", rep.Midway)
			}
		}()
	}
	logf("churning %d writes/s for %s", spec.Rate, spec.Duration)
	if spec.OnChurn != nil {
		spec.OnChurn(true)
	}
	rep.Churn, err = f.Churn(ctx, spec.Rate, spec.Duration, spec.Burst, meter.Wrote)
	if spec.OnChurn != nil {
		spec.OnChurn(false)
	}
	cancel()
	wg.Wait()
	if err != nil {
		return rep, fmt.Errorf("churn: %w", err)
	}
	rep.Lost = f.Verify(ctx)
	rep.SummaryErr = VerifySummaries(ctx, s, 30*time.Second)
	// Every write has been counted by now if the summaries are right;
	// give the meter the last flush.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lags, unseen := meter.Lags(time.Time{}, time.Time{})
		rep.StatusLag, rep.Unseen = lags, unseen
		if unseen == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	step := rep.Churn.Elapsed / 10
	for i := range 10 {
		w := LagWindow{From: time.Duration(i) * step, To: time.Duration(i+1) * step}
		w.Lags, _ = meter.Lags(churnStart.Add(w.From), churnStart.Add(w.To))
		rep.LagWindows = append(rep.LagWindows, w)
	}
	return rep, nil
}

// LagWindow is the status lag of the writes sent in one window.
type LagWindow struct {
	From, To time.Duration // since the writes began
	Lags     []time.Duration
}

// applier deploys a one-service manifest on the simulated fleet and
// measures its final commit to every gateway's view.
type applier struct {
	s   *store.Store
	gws *Gateways

	mu        sync.Mutex
	committed time.Time
}

func (a *applier) apply(ctx context.Context, i int) ([]time.Duration, error) {
	replicas := 10
	m := &store.Manifest{Namespace: "loadapp", Services: map[string]store.ServiceSpec{"web": {
		Command: []string{"/simulated"}, Replicas: &replicas, Env: map[string]string{"V": fmt.Sprint(i)},
		Routes: []store.Route{{Hosts: []string{"loadapp.example.com"}}}}}}
	d := deploy.New(a.s, deploy.Options{DrainGrace: time.Millisecond, GatewayWait: 5 * time.Second,
		OnStep: func(s deploy.Step, _ time.Duration) {
			if s == deploy.StepFinalCommit {
				a.mu.Lock()
				a.committed = time.Now()
				a.mu.Unlock()
			}
		}})
	st, err := d.Apply(ctx, m)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	from := a.committed
	a.mu.Unlock()
	return a.gws.WaitReached(ctx, st.RoutingSeq, from, 30*time.Second)
}

// describe says how one apply's final commit reached the gateways: the
// spread, and which gateway was last, so that a slow tail can be followed
// to one gateway's log.
func (a *applier) describe(lags []time.Duration) string {
	if len(lags) == 0 {
		return "no gateways"
	}
	last := 0
	for i, l := range lags {
		if l > lags[last] {
			last = i
		}
	}
	l := slices.Sorted(slices.Values(lags))
	return fmt.Sprintf("p50 %s, p99 %s, max %s (%s)", ms(Percentile(l, 50)), ms(Percentile(l, 99)), ms(l[len(l)-1]), a.gws.Names[last])
}

// Summary is the report in a few lines.
func (r *LoadReport) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "agents started in %s\n", r.StartAgents.Round(time.Millisecond))
	fmt.Fprintf(&b, "writes: %d acknowledged in %s (%.0f/s), %d retried, %d could not start on time; %d observation writes stored them\n",
		r.Churn.Writes, r.Churn.Elapsed.Round(time.Millisecond), r.Churn.Rate(), r.Churn.Retries, r.Churn.Behind, r.Churn.Stored)
	fmt.Fprintf(&b, "meanwhile %d summary writes (%.2f a change) and %d heartbeats (%.2f a change)\n",
		r.Churn.Summaries, float64(r.Churn.Summaries)/float64(max(1, r.Churn.Writes)), r.Churn.Beats, float64(r.Churn.Beats)/float64(max(1, r.Churn.Writes)))
	fmt.Fprintf(&b, "longest time with no write acknowledged: %s (from %.1fs into the writes)\n",
		r.Churn.Stall.Round(time.Millisecond), r.Churn.StallAt.Seconds())
	fmt.Fprintf(&b, "status lag: p50 %s, p99 %s, max %s over %d writes; %d never counted\n",
		ms(Percentile(r.StatusLag, 50)), ms(Percentile(r.StatusLag, 99)), ms(Percentile(r.StatusLag, 100)), len(r.StatusLag), r.Unseen)
	if len(r.LagWindows) > 0 {
		b.WriteString("status lag p99 of the writes sent in each tenth of the writes:")
		for _, w := range r.LagWindows {
			fmt.Fprintf(&b, " %s", ms(Percentile(w.Lags, 99)))
		}
		b.WriteString("\n")
	}
	for _, c := range []struct {
		what string
		lags []time.Duration
	}{{"idle", r.CommitLagIdle}, {"during the writes", r.CommitLagBusy}} {
		if len(c.lags) == 0 {
			continue
		}
		l := slices.Sorted(slices.Values(c.lags))
		fmt.Fprintf(&b, "final commit to every gateway's view, %s: p50 %s, p99 %s, max %s over %d (apply, gateway) pairs\n",
			c.what, ms(Percentile(l, 50)), ms(Percentile(l, 99)), ms(Percentile(l, 100)), len(l))
	}
	if r.Midway != "" {
		fmt.Fprintf(&b, "midway: %s\n", r.Midway)
	}
	for _, e := range r.ApplyErrors {
		fmt.Fprintf(&b, "apply failed during the writes: %s\n", e)
	}
	lost, sums := "none", "equal to a recount"
	if r.Lost != nil {
		lost = r.Lost.Error()
	}
	if r.SummaryErr != nil {
		sums = r.SummaryErr.Error()
	}
	fmt.Fprintf(&b, "lost updates: %s; summaries: %s", lost, sums)
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
