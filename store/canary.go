package store

import (
	"context"
	"fmt"
	"time"
)

// Progressive delivery. A manifest's Rollout turns the apply's checkpoint
// step into a canary: each step is a checkpoint commit that routes Weight
// percent of every changed service's traffic to the new revision's
// instances (the rest to those the live commit routes), held while the
// control plane reads the gateways' counters of both revisions; within the
// limits the apply goes on to the final commit, beyond them it aborts with
// a checkpoint commit marked Abort, which routes everything back.

// CanarySpec is a manifest's rollout: the steps a new revision goes
// through before its final commit, and the limits it is judged by.
type CanarySpec struct {
	Steps  []CanaryStep `json:"steps" yaml:"steps"`
	Limits CanaryLimits `json:"limits,omitzero" yaml:"limits,omitempty"`
	// Sticky keeps each client on one revision (a cookie holds the
	// client's bucket, and raising the weight only ever moves clients to
	// the new revision).
	Sticky bool `json:"sticky,omitempty" yaml:"sticky,omitempty"`
	// Match sends the requests it matches to the new revision whatever the
	// weight: testers first.
	Match *CanaryMatch `json:"match,omitempty" yaml:"match,omitempty"`
}

// CanaryStep is one step of a rollout: Weight percent of the traffic to
// the new revision (0 routes only what Match matches), held for Hold.
type CanaryStep struct {
	Weight int      `json:"weight" yaml:"weight"`
	Hold   Duration `json:"hold" yaml:"hold"`
}

// CanaryLimits are what a canary is judged by, over everything the
// gateways counted for it since it began. Zero values take the defaults.
type CanaryLimits struct {
	// Max5xxRatio is how far the new revision's share of 5xx responses
	// may exceed the old revision's; default DefaultMax5xxRatio.
	Max5xxRatio float64 `json:"max_5xx_ratio,omitempty" yaml:"max_5xx_ratio,omitempty"`
	// MaxP99Ratio bounds the new revision's p99 latency as a multiple of
	// the old revision's (never less than P99Floor); default
	// DefaultMaxP99Ratio.
	MaxP99Ratio float64 `json:"max_p99_ratio,omitempty" yaml:"max_p99_ratio,omitempty"`
	// MinRequests is how many requests the new revision must have served
	// before a step may pass, and before a limit may abort it early;
	// nil is DefaultMinRequests.
	MinRequests *int `json:"min_requests,omitempty" yaml:"min_requests,omitempty"`
}

// Defaults of CanaryLimits.
const (
	DefaultMax5xxRatio = 0.01
	DefaultMaxP99Ratio = 2.0
	DefaultMinRequests = 20
	// P99Floor is the least old-revision p99 the ratio is taken of, so
	// that a few milliseconds of noise on a fast service abort nothing.
	P99Floor = 0.025
)

// WithDefaults returns l with its defaults filled in.
func (l CanaryLimits) WithDefaults() CanaryLimits {
	if l.Max5xxRatio == 0 {
		l.Max5xxRatio = DefaultMax5xxRatio
	}
	if l.MaxP99Ratio == 0 {
		l.MaxP99Ratio = DefaultMaxP99Ratio
	}
	if l.MinRequests == nil {
		n := DefaultMinRequests
		l.MinRequests = &n
	}
	return l
}

// CanaryMatch selects requests by a header's or a cookie's exact value.
type CanaryMatch struct {
	Header string `json:"header,omitempty" yaml:"header,omitempty"`
	Cookie string `json:"cookie,omitempty" yaml:"cookie,omitempty"`
	Value  string `json:"value" yaml:"value"`
}

// Canary marks a checkpoint commit as a canary step (Step from 1, the
// weight it routes), or, with Abort, as the end of an aborted canary:
// the live commit alone is routed again.
type Canary struct {
	Step   int  `json:"step"`
	Weight int  `json:"weight"`
	Abort  bool `json:"abort,omitempty"`
}

// Split divides a service's traffic: endpoints of Revision (the canary's
// new instances) get Weight percent, the others the rest. Deploy names
// the canary, and so the counters gateways keep for it.
type Split struct {
	Deploy   string `json:"deploy"`
	Revision int64  `json:"revision"`
	// From is the revision of the live commit the canary is measured
	// against.
	From   int64        `json:"from"`
	Weight int          `json:"weight"`
	Sticky bool         `json:"sticky,omitempty"`
	Match  *CanaryMatch `json:"match,omitempty"`
}

// StickyCookie is the cookie holding a client's canary bucket.
const StickyCookie = "edgeplane_canary"

// CanaryBuckets is the number of sticky buckets: a client whose bucket is
// below Weight*CanaryBuckets/100 goes to the new revision.
const CanaryBuckets = 10000

// LatestCheckpoint returns ns's latest checkpoint commit, verified, or
// nil if it has none.
func (s *Store) LatestCheckpoint(ctx context.Context, ns string) (*DeployCommit, error) {
	subj := s.Names.DeployCommitSubject(ns, CommitCheckpoint)
	var found *StoredMsg
	if err := s.LastOf(ctx, s.Names.DeployCommitsStream(), []string{subj}, func(m *StoredMsg) error {
		found = m
		return nil
	}); err != nil {
		return nil, classify(fmt.Errorf("reading checkpoint commit of %s: %w", ns, err))
	}
	if found == nil {
		return nil, nil
	}
	return s.verifiedCommit(ctx, found)
}

// CanaryVerdict is how a canary step ended, or that it holds.
type CanaryVerdict string

// Verdicts of a canary step.
const (
	CanaryHolding  CanaryVerdict = "holding"
	CanaryPassed   CanaryVerdict = "passed"
	CanaryAborted  CanaryVerdict = "aborted"
	CanaryPromoted CanaryVerdict = "promoted"
)

// CanaryStepStatus is one step of a canary as the apply judged it.
type CanaryStepStatus struct {
	Step      int       `json:"step"`
	Weight    int       `json:"weight"`
	Hold      Duration  `json:"hold"`
	CommitSeq uint64    `json:"commit_seq,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Verdict is holding, passed, aborted or promoted (by hand).
	Verdict CanaryVerdict `json:"verdict"`
	// Reason says why a step ended as it did: the limit exceeded and by
	// what figures, or who decided.
	Reason string `json:"reason,omitempty"`
	// Judged are the figures the verdict was reached on, by service.
	Judged []CanaryFigures `json:"judged,omitempty"`
}

// CanaryFigures are one service's canary counters summed over the
// gateways: the old and the new revision side by side.
type CanaryFigures struct {
	Service string         `json:"service"`
	Old     RevisionTotals `json:"old"`
	New     RevisionTotals `json:"new"`
	// Votes are what each gateway's own figures said, when more than one
	// gateway counted the canary: the verdict is their majority's, so that
	// one gateway's report cannot decide alone. Empty with one gateway.
	Votes []CanaryVote `json:"votes,omitempty"`
}

// CanaryVote is one gateway's figures of a canary, judged on their own
// (Gateway "" is the gateways that each counted too few requests to vote,
// pooled).
type CanaryVote struct {
	Gateway string         `json:"gateway"`
	Old     RevisionTotals `json:"old"`
	New     RevisionTotals `json:"new"`
	Breach  bool           `json:"breach,omitempty"`
}

// RevisionTotals are one side of a split as the gateways counted it.
type RevisionTotals struct {
	Revision   int64   `json:"revision"`
	Requests   uint64  `json:"requests"`
	Errors     uint64  `json:"errors_5xx"`
	ErrorRatio float64 `json:"error_ratio"`
	P99        float64 `json:"p99_s"`
}

// CanaryTraffic is one service's counters for one canary at one gateway:
// the requests it routed to each side of the split since the split began
// there.
type CanaryTraffic struct {
	Deploy string         `json:"deploy"`
	Old    RevisionCounts `json:"old"`
	New    RevisionCounts `json:"new"`
}

// RevisionCounts are one side's responses by status class and latency
// (per TrafficLatencyBounds).
type RevisionCounts struct {
	Revision int64     `json:"rev"`
	Classes  [5]uint64 `json:"classes"`
	Latency  []uint64  `json:"lat"`
}

// Totals turns summed counts into figures.
func (c *RevisionCounts) Totals() RevisionTotals {
	t := RevisionTotals{Revision: c.Revision, Errors: c.Classes[4]}
	for _, n := range c.Classes {
		t.Requests += n
	}
	if t.Requests > 0 {
		t.ErrorRatio = float64(t.Errors) / float64(t.Requests)
	}
	t.P99 = LatencyQuantile(0.99, c.Latency)
	return t
}

// Add adds o's counts to c's.
func (c *RevisionCounts) Add(o *RevisionCounts) {
	for i := range c.Classes {
		c.Classes[i] += o.Classes[i]
	}
	if len(o.Latency) != len(TrafficLatencyBounds)+1 {
		return
	}
	if c.Latency == nil {
		c.Latency = make([]uint64, len(o.Latency))
	}
	for i := range c.Latency {
		c.Latency[i] += o.Latency[i]
	}
}

// CanaryDecision is an operator's word on a canary under way: promote it
// now or abort it. Key: DeployStatusKey(namespace, deploy).
type CanaryDecision struct {
	Version   int       `json:"version"`
	Namespace string    `json:"namespace"`
	DeployID  string    `json:"deploy_id"`
	Action    string    `json:"action"`
	By        string    `json:"by,omitempty"`
	At        time.Time `json:"at"`
}

func (r *CanaryDecision) version() int { return r.Version }

// Canary decisions.
const (
	DecisionPromote = "promote"
	DecisionAbort   = "abort"
)

// KeyOK checks the decision is filed under the deploy it names.
func (r *CanaryDecision) KeyOK(key string) error {
	return keyMust(key, DeployStatusKey(r.Namespace, r.DeployID))
}

// PutCanaryDecision records an operator's decision on a canary.
func (s *Store) PutCanaryDecision(ctx context.Context, d *CanaryDecision) error {
	if d.Action != DecisionPromote && d.Action != DecisionAbort {
		return Errorf(CodeInvalid, "canary decision %q: want %s or %s", d.Action, DecisionPromote, DecisionAbort)
	}
	d.Version, d.At = RecordVersion, time.Now().UTC()
	_, err := PutJSON(ctx, s.canaryDecisions, DeployStatusKey(d.Namespace, d.DeployID), d)
	return err
}

// CanaryDecisionOf returns the decision recorded on deploy of ns, or nil.
func (s *Store) CanaryDecisionOf(ctx context.Context, ns, deploy string) (*CanaryDecision, error) {
	var d CanaryDecision
	key := DeployStatusKey(ns, deploy)
	if _, err := GetJSON(ctx, s.canaryDecisions, key, &d); err != nil {
		if HasCode(err, CodeNotFound) {
			return nil, nil
		}
		return nil, err
	}
	if err := d.KeyOK(key); err != nil {
		return nil, err
	}
	return &d, nil
}
