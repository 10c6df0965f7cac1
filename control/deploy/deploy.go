// Package deploy is the orchestrator's apply flow: the nine explicit steps of
// a deploy (preview, lease, probe, status, candidates, checkpoint, final
// commit, routing events, drain), each with its durable phase record, plus
// the reads around it (status, history) and rollback.
//
// Before the final commit a failure leaves no lasting change but the failed
// status that explains it. After it the deploy is live; anything that
// interrupts the rest (a crash before the routing events went out) is
// finished by the next operation on the namespace or by `control server`,
// which finishes every deploy whose orchestrator's lease expired
// (RunCompleter): the same steps the apply would have taken, never a
// reconciliation of observed state toward intent.
//
// Decisions others act on: an instance leaving routing is stopped after
// the gateways applied the routing and, for a service with layer-4 entry
// points, once no gateway that applied it reports connections to it
// draining (bounded by the service's drain timeout plus L4DrainMargin);
// a manifest with layer-4 entry points is refused while a gateway before
// store.GenerationLayer4 is live (layer4.go).
package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/control/hosts"
	"github.com/edgeplane/edgeplane/control/manifest"
	"github.com/edgeplane/edgeplane/control/regions"
	"github.com/edgeplane/edgeplane/store"
)

// Step is one of the nine steps of the apply flow, numbered from 1 in
// order; its phase record carries the number as Index and Name as Name.
type Step int

// The steps of the apply flow, in order.
const (
	StepPreview Step = iota + 1
	StepLease
	StepProbe
	StepStatus
	StepStartCandidates
	StepCheckpoint
	StepFinalCommit
	StepPublishRouting
	StepDrainOld
)

// Error codes of deploys that did not finish, as their statuses record
// them.
const (
	// CodeInterrupted: the apply was interrupted (Ctrl-C) before its
	// final commit; its candidates were stopped.
	CodeInterrupted = "interrupted"
	// CodeAbandoned: the orchestrator stopped before the final commit
	// without saying so (killed, or its machine died); whoever held the
	// namespace lease next recorded it.
	CodeAbandoned = "abandoned"
)

// NumSteps is how many steps an apply has.
const NumSteps = int(StepDrainOld)

var stepNames = [...]string{
	StepPreview: "preview", StepLease: "lease", StepProbe: "probe", StepStatus: "status",
	StepStartCandidates: "start_candidates", StepCheckpoint: "checkpoint", StepFinalCommit: "final_commit",
	StepPublishRouting: "publish_routing", StepDrainOld: "drain_old",
}

// Name is the step's name in phase records and deploy statuses.
func (s Step) Name() string {
	if s < StepPreview || s > StepDrainOld {
		return fmt.Sprintf("step%d", int(s))
	}
	return stepNames[s]
}

func (s Step) String() string { return s.Name() }

// Options tune a Deployer. Zero values take the defaults given.
type Options struct {
	// Holder names this orchestrator in leases; default host:pid.
	Holder string
	// Out receives one progress line per step; default io.Discard.
	Out io.Writer
	// LeaseTTL of the namespace deploy lease, renewed while held; default 10s.
	LeaseTTL time.Duration
	// ProbeTimeout bounds each machine's capacity probe; default 2s.
	ProbeTimeout time.Duration
	// RPCTimeout bounds other machine RPCs beyond their own waits; default 10s.
	RPCTimeout time.Duration
	// GatewayWait bounds the wait for gateways to apply the new routing
	// events before old instances are drained; default 10s.
	GatewayWait time.Duration
	// DrainGrace is the pause after the gateway wait, so requests already
	// in flight to old instances finish; default 2s.
	DrainGrace time.Duration
	// StopGrace is SIGTERM-to-SIGKILL for old instances; default 10s.
	StopGrace time.Duration
	// OnStep, if set, is told each step as it completes with the time
	// since the previous one (benchmarks split control-plane overhead from
	// readiness waits with it). It assumes one apply at a time.
	OnStep func(step Step, took time.Duration)
}

// Deployer runs deploys against one store.
type Deployer struct {
	s    *store.Store
	opts Options

	mu       sync.Mutex
	lastStep time.Time
}

// New returns a Deployer with opts' defaults filled in.
func New(s *store.Store, opts Options) *Deployer {
	if opts.Holder == "" {
		opts.Holder = store.DefaultHolder()
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&opts.LeaseTTL, 10*time.Second)
	def(&opts.ProbeTimeout, 2*time.Second)
	def(&opts.RPCTimeout, 10*time.Second)
	def(&opts.GatewayWait, 10*time.Second)
	def(&opts.DrainGrace, 2*time.Second)
	def(&opts.StopGrace, 10*time.Second)
	return &Deployer{s: s, opts: opts}
}

func (d *Deployer) printf(format string, args ...any) {
	fmt.Fprintf(d.opts.Out, format+"\n", args...)
}

func (d *Deployer) step(s Step, format string, args ...any) {
	if d.opts.OnStep != nil {
		d.mu.Lock()
		now := time.Now()
		took := now.Sub(d.lastStep)
		d.lastStep = now
		d.mu.Unlock()
		d.opts.OnStep(s, took)
	}
	d.printf("[%d/%d] %s: %s", s, NumSteps, s.Name(), fmt.Sprintf(format, args...))
}

// state is what a plan is computed from.
type state struct {
	live  *store.DeployCommit
	insts map[string]*store.InstanceRecord
	// machines are by ID, each with the state placement takes it in
	// (its own and its region's: regions.PlacementState).
	machines map[string]store.MachineRecord
	// regions are the states operators set, by region.
	regions map[string]store.RegionRecord

	// What agents last wrote of their machines, read once on first use
	// (image pinning and placement both need it).
	states map[string]store.MachineState
	beats  map[string]store.MachineBeat
}

// observations returns the machines' states and heartbeats, reading them
// on first use.
func (st *state) observations(ctx context.Context, s *store.Store) (map[string]store.MachineState, map[string]store.MachineBeat, error) {
	if st.beats == nil {
		states, beats, err := s.MachineObservations(ctx)
		if err != nil {
			return nil, nil, err
		}
		st.states, st.beats = states, beats
	}
	return st.states, st.beats, nil
}

func (d *Deployer) load(ctx context.Context, ns string) (*state, error) {
	st := &state{}
	live, err := d.s.LiveCommit(ctx, ns)
	switch {
	case err == nil:
		st.live = live
	case !store.HasCode(err, store.CodeNotFound):
		return nil, err
	}
	if st.insts, err = d.s.NamespaceInstances(ctx, ns); err != nil {
		return nil, err
	}
	if st.machines, st.regions, err = regions.Read(ctx, d.s); err != nil {
		return nil, err
	}
	// Placement takes a machine in a draining or disabled region as a
	// draining or disabled machine: nothing new goes there, and a
	// disabled region's instances move at their service's next deploy,
	// as a disabled machine's do.
	for id, m := range st.machines {
		m.State = regions.PlacementState(m.State, regions.StateOf(st.regions, m.Region))
		st.machines[id] = m
	}
	return st, nil
}

// checkRegions refuses, before anything is written, a manifest naming a
// region (in placement.regions or locality.order) that no machine is in
// and no record names: store.ErrUnknownRegion with the field path.
func checkRegions(m *store.Manifest, st *state) error {
	named := manifest.Regions(m)
	known := regions.Known(st.machines, st.regions)
	for _, path := range slices.Sorted(maps.Keys(named)) {
		if err := regions.Check(named[path], known); err != nil {
			return store.AsError(err).With("field", path)
		}
	}
	return nil
}

// Preview plans m against stored intent and status, writing nothing.
// Machines for new slots are chosen among active stored machines; apply
// chooses again among those that answer its live probe.
func (d *Deployer) Preview(ctx context.Context, m *store.Manifest) (*Plan, error) {
	if err := manifest.Validate(m); err != nil {
		var me *manifest.Error
		if errors.As(err, &me) {
			return nil, me.Structured()
		}
		return nil, err
	}
	if err := hosts.Check(ctx, d.s, m.Namespace, hosts.Of(m)); err != nil {
		return nil, err
	}
	if err := gatewaysServe(ctx, d.s, m); err != nil {
		return nil, err
	}
	st, err := d.load(ctx, m.Namespace)
	if err != nil {
		return nil, err
	}
	if err := checkRegions(m, st); err != nil {
		return nil, err
	}
	// As the apply will: images compared by what they are now.
	if err := d.pinImages(ctx, m, st); err != nil {
		return nil, err
	}
	p := buildPlan(m, st.live, st.insts, st.machines)
	var cands []*candidate
	for _, rec := range st.machines {
		cands = append(cands, &candidate{rec: rec, free: 1 << 30, perService: map[string]int{}})
	}
	if err := place(p, cands); err != nil {
		return p, err
	}
	return p, nil
}

// Statuses returns every deploy status of ns, oldest first.
func (d *Deployer) Statuses(ctx context.Context, ns string) ([]store.DeployStatus, error) {
	out, err := d.s.DeployStatuses(ctx, ns)
	sort.Slice(out, func(i, j int) bool { return out[i].DeployID < out[j].DeployID })
	return out, err
}

// Namespaces lists namespaces with any deploy status.
func (d *Deployer) Namespaces(ctx context.Context) ([]string, error) {
	return d.s.DeployStatusNamespaces(ctx)
}

// History returns the final commits of ns, oldest first. A commit whose
// signature does not verify is left out (never a rollback target) and
// named in the returned refusals.
func (d *Deployer) History(ctx context.Context, ns string) ([]store.DeployCommit, []error, error) {
	return d.s.CommitHistory(ctx, ns)
}

// Rollback deploys again the spec of an earlier final commit of ns: the one
// named by to (a deploy ID), or the one before the live commit.
func (d *Deployer) Rollback(ctx context.Context, ns, to string) (*store.DeployStatus, error) {
	hist, _, err := d.History(ctx, ns)
	if err != nil {
		return nil, err
	}
	if len(hist) == 0 {
		return nil, store.Errorf(store.CodeNotFound, "namespace %s has no committed deploy", ns).With("namespace", ns)
	}
	var target *store.DeployCommit
	if to == "" {
		if len(hist) < 2 {
			return nil, store.Errorf(store.CodeNotFound, "namespace %s has no earlier commit to roll back to", ns).With("namespace", ns)
		}
		target = &hist[len(hist)-2]
	} else {
		for i := range hist {
			if hist[i].ID == to {
				target = &hist[i]
			}
		}
		if target == nil {
			return nil, store.Errorf(store.CodeNotFound, "no final commit %s in namespace %s", to, ns).
				With("namespace", ns).With("commit", to)
		}
	}
	d.printf("rolling back %s to commit %s (revision %d)", ns, target.ID, target.Revision)
	m := target.Manifest
	return d.apply(ctx, &m, intent{rollbackOf: target.ID})
}

// Apply runs the nine steps for m.
func (d *Deployer) Apply(ctx context.Context, m *store.Manifest) (*store.DeployStatus, error) {
	return d.apply(ctx, m, intent{})
}

// Destroy retires namespace ns through the same nine steps: a final commit
// marked destroy with no services, so history shows it; its routing is
// removed, its instances stopped and its hosts released.
func (d *Deployer) Destroy(ctx context.Context, ns string) (*store.DeployStatus, error) {
	live, err := d.s.LiveCommit(ctx, ns)
	if err != nil {
		if store.HasCode(err, store.CodeNotFound) {
			return nil, store.Errorf(store.CodeNotFound, "namespace %s has no committed deploy to destroy", ns).With("namespace", ns)
		}
		return nil, err
	}
	if live.Destroy {
		return nil, store.Errorf(store.CodeInvalid, "namespace %s was destroyed by deploy %s already", ns, live.ID).
			With("namespace", ns).With("deploy", live.ID)
	}
	d.printf("destroying namespace %s (live revision %d, deploy %s)", ns, live.Revision, live.ID)
	return d.apply(ctx, &store.Manifest{Namespace: ns, Services: map[string]store.ServiceSpec{}}, intent{destroy: true})
}

func (d *Deployer) putStatus(ctx context.Context, st *store.DeployStatus) error {
	return d.s.PutDeployStatus(ctx, st)
}

func (d *Deployer) putPhase(ctx context.Context, ns, id string, s Step, state store.PhaseState, detail string, commitSeq uint64) error {
	return d.s.PutPhase(ctx, &store.PhaseRecord{Namespace: ns, DeployID: id, Index: int(s), Name: s.Name(),
		State: state, Detail: detail, CommitSeq: commitSeq})
}

// Phases returns the phase records of one deploy in step order.
func (d *Deployer) Phases(ctx context.Context, ns, id string) ([]store.PhaseRecord, error) {
	out, err := d.s.DeployPhases(ctx, ns, id)
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, err
}

// Live returns the live (latest final) commit of ns.
func (d *Deployer) Live(ctx context.Context, ns string) (*store.DeployCommit, error) {
	return d.s.LiveCommit(ctx, ns)
}
