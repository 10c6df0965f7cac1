// Package doctor reads every layer of an installation and says where they
// disagree: the live commits (intent) against the instance records, the
// records against what each agent runs, the routing the store derives
// against what each gateway serves and each DNS server answers, machines
// against mesh peers, regions against the gateways that serve them,
// the gateway ports routing asks for against those gateways could open
// and their layer-4 drains against the services' drain timeouts,
// routed hosts against their owners and certificates, and leases against
// their holders. It writes nothing: it is what an
// operator runs first when something looks wrong, and what a test runs to
// prove the fleet is coherent.
package doctor

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgeplane/edgeplane/projection"
	"github.com/edgeplane/edgeplane/store"
)

// Severities of a finding. Problems make the report incoherent; warnings
// and notes are said but change nothing: a warning is a setting that
// serves otherwise than an operator likely meant, a note is worth knowing.
const (
	Problem = "problem"
	Warning = "warning"
	Note    = "note"
)

// Layers a finding is about.
const (
	LayerDeploys   = "deploys"
	LayerInstances = "instances"
	LayerMachines  = "machines"
	LayerRouting   = "routing"
	LayerHosts     = "hosts"
	LayerGateways  = "gateways"
	LayerDNS       = "dns"
	LayerMesh      = "mesh"
	LayerCerts     = "certs"
	LayerLeases    = "leases"
	LayerRegions   = "regions"
)

// Finding is one disagreement between layers (or one thing worth saying).
type Finding struct {
	Layer    string `json:"layer"`
	Severity string `json:"severity"`
	// Subject is what it is about: "shop/web", "machine m1", "gateway gw1".
	Subject string `json:"subject"`
	Message string `json:"message"`
}

// Report is a doctor's run.
type Report struct {
	// Coherent is set when no finding is a problem.
	Coherent bool `json:"coherent"`
	// RoutingSeq is the routing stream sequence the expected routing was
	// derived at.
	RoutingSeq uint64 `json:"routing_seq"`
	// Checked counts what was looked at, by layer.
	Checked  map[string]int `json:"checked"`
	Findings []Finding      `json:"findings"`
	At       time.Time      `json:"at"`
}

// Problems counts the findings that are problems.
func (r *Report) Problems() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == Problem {
			n++
		}
	}
	return n
}

// Options say what else to read beyond the store.
type Options struct {
	// Gateways are Caddy admin API addresses ("http://127.0.0.1:2019") of
	// gateways to read directly, beside the reports every gateway writes
	// to the store (a gateway cut off from NATS reports nothing there).
	Gateways []string
	// DNS are addresses ("127.0.0.1:53") of edgeplane DNS servers to ask.
	DNS []string
	// Zone the DNS servers answer; default "edgeplane.internal.".
	Zone string
	// ProbeTimeout bounds each call to an agent, gateway or DNS server;
	// default 2s.
	ProbeTimeout time.Duration
	// HTTP is the client for gateway admin APIs; default one with
	// ProbeTimeout.
	HTTP *http.Client
}

// DefaultZone is what edgeplane DNS answers unless configured otherwise.
const DefaultZone = "edgeplane.internal."

// doctor is one run.
type doctor struct {
	s   *store.Store
	o   Options
	now time.Time

	mu  sync.Mutex
	rep *Report

	// What the layers are checked against, read once.
	rs        *store.RoutingState
	view      *projection.View
	head      uint64
	live      map[string]*store.DeployCommit // by namespace
	insts     map[string]*store.InstanceRecord
	machines  map[string]store.MachineRecord
	inflight  map[string]string // namespace -> lease holder, deploys in progress
	hostOwner map[string]store.HostClaim
}

// Run reads every layer and returns what disagrees. An error means a layer
// could not be read at all (the store is unreachable); what one machine,
// gateway or DNS server fails to answer is a finding.
func Run(ctx context.Context, s *store.Store, o Options) (*Report, error) {
	if o.Zone == "" {
		o.Zone = DefaultZone
	}
	if !strings.HasSuffix(o.Zone, ".") {
		o.Zone += "."
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 2 * time.Second
	}
	if o.HTTP == nil {
		o.HTTP = &http.Client{Timeout: o.ProbeTimeout}
	}
	d := &doctor{s: s, o: o, now: time.Now(), rep: &Report{Checked: map[string]int{}, Findings: []Finding{}}}
	if err := d.readIntent(ctx); err != nil {
		return nil, err
	}
	steps := []func(context.Context) error{
		d.checkDeploys, d.checkInstances, d.checkMachines, d.checkRouting, d.checkHosts, d.checkPorts,
		d.checkGateways, d.checkDNS, d.checkMesh, d.checkCerts, d.checkLeases, d.checkRegions, d.checkLayer4,
	}
	// The layers are independent reads; the slow ones (agents, gateways,
	// DNS) wait on the network, so they run side by side.
	errs := make([]error, len(steps))
	var wg sync.WaitGroup
	for i, step := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = step(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	r := d.rep
	r.RoutingSeq, r.At = d.rs.Seq, d.now.UTC()
	sort.SliceStable(r.Findings, func(i, j int) bool {
		a, b := r.Findings[i], r.Findings[j]
		if a.Severity != b.Severity {
			return severityRank(a.Severity) < severityRank(b.Severity)
		}
		if a.Layer != b.Layer {
			return a.Layer < b.Layer
		}
		return a.Subject < b.Subject
	})
	r.Coherent = r.Problems() == 0
	return r, nil
}

// severityRank orders findings: problems first, then warnings, then notes.
func severityRank(s string) int {
	switch s {
	case Problem:
		return 0
	case Warning:
		return 1
	}
	return 2
}

func (d *doctor) add(layer, severity, subject, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rep.Findings = append(d.rep.Findings, Finding{Layer: layer, Severity: severity, Subject: subject, Message: fmt.Sprintf(format, args...)})
}

func (d *doctor) checked(layer string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rep.Checked[layer] += n
}

// readIntent reads what everything else is compared with: the routing the
// store derives, the live commits, instance and machine records, deploys in
// progress and host claims.
func (d *doctor) readIntent(ctx context.Context) error {
	var err error
	if d.rs, err = d.s.LoadRouting(ctx); err != nil {
		return err
	}
	var bad []error
	d.view, bad = projection.FromState(d.rs)
	for _, e := range bad {
		d.add(LayerRouting, Problem, "routing stream", "a stored routing event cannot be applied: %v", e)
	}
	for _, r := range d.rs.Refused {
		if d.refusedRegion(r) {
			continue
		}
		d.add(LayerRouting, Problem, r.Subject, "the last routing event (sequence %d) does not verify: %v; gateways keep serving what they had", r.Seq, r.Err)
	}
	info, err := d.s.RoutingInfo(ctx)
	if err != nil {
		return store.Classify(fmt.Errorf("reading the routing stream: %w", err))
	}
	d.head = info.State.LastSeq

	d.live = map[string]*store.DeployCommit{}
	nss, err := d.s.CommittedNamespaces(ctx)
	if err != nil {
		return err
	}
	for _, ns := range nss {
		c, err := d.s.LiveCommit(ctx, ns)
		if err != nil {
			d.add(LayerDeploys, Problem, ns, "live commit unreadable: %v", err)
			continue
		}
		d.live[ns] = c
	}
	d.insts = map[string]*store.InstanceRecord{}
	if err := d.s.ListInstances(ctx, ">", func(_ string, r *store.InstanceRecord) error {
		d.insts[r.ID] = r
		return nil
	}); err != nil {
		return err
	}
	d.machines = map[string]store.MachineRecord{}
	if err := d.s.ListMachines(ctx, func(m *store.MachineRecord) error {
		d.machines[m.ID] = *m
		return nil
	}); err != nil {
		return err
	}
	d.inflight = map[string]string{}
	for ns := range d.live {
		if h, err := d.s.LockHolder(ctx, store.DeployLockKey(ns)); err == nil && d.now.Before(h.Expires) {
			d.inflight[ns] = h.Holder
		}
	}
	d.hostOwner = map[string]store.HostClaim{}
	return d.s.ListHostClaims(ctx, func(c *store.HostClaim) error {
		d.hostOwner[c.Host] = *c
		return nil
	})
}
