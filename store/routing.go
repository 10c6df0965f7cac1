package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/edgeplane/edgeplane/signing"
)

// LiveCommit returns the latest final commit of namespace: what it serves.
// It is verified: a commit without a good signature is refused with
// bad_signature, never acted on.
func (s *Store) LiveCommit(ctx context.Context, namespace string) (*DeployCommit, error) {
	subj := s.Names.DeployCommitSubject(namespace, CommitFinal)
	var found *StoredMsg
	if err := s.LastOf(ctx, s.Names.DeployCommitsStream(), []string{subj}, func(m *StoredMsg) error {
		found = m
		return nil
	}); err != nil {
		return nil, classify(fmt.Errorf("reading live commit of %s: %w", namespace, err))
	}
	if found == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("namespace %s has no committed deploy", namespace),
			Detail: map[string]string{"namespace": namespace}}
	}
	return s.verifiedCommit(ctx, found)
}

// CommitAt reads the commit stored at stream sequence seq, verified.
func (s *Store) CommitAt(ctx context.Context, seq uint64) (*DeployCommit, error) {
	var found *StoredMsg
	if _, err := s.direct(ctx, s.Names.DeployCommitsStream(), directRequest{Seq: seq}, func(m *StoredMsg) error {
		if m.Seq == seq {
			found = m
		}
		return nil
	}); err != nil {
		return nil, classify(fmt.Errorf("reading commit %d: %w", seq, err))
	}
	if found == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no commit at sequence %d", seq)}
	}
	return s.verifiedCommit(ctx, found)
}

// CommitHistory returns the final commits of namespace, oldest first, each
// verified; those that are not are left out and returned in refused.
func (s *Store) CommitHistory(ctx context.Context, namespace string) (good []DeployCommit, refused []error, err error) {
	subj := s.Names.DeployCommitSubject(namespace, CommitFinal)
	_, err = s.ReadFrom(ctx, s.Names.DeployCommitsStream(), 1, subj, func(m *StoredMsg) error {
		c, err := s.verifiedCommit(ctx, m)
		switch {
		case HasCode(err, CodeBadSignature) || HasCode(err, CodeInvalid):
			refused = append(refused, err)
		case err != nil:
			return err
		default:
			good = append(good, *c)
		}
		return nil
	})
	if err != nil {
		return nil, nil, classify(fmt.Errorf("reading history of %s: %w", namespace, err))
	}
	return good, refused, nil
}

// verifiedCommit decodes m, a message of the commits stream, after checking
// its signature and that its subject is the one its body belongs on.
func (s *Store) verifiedCommit(ctx context.Context, m *StoredMsg) (*DeployCommit, error) {
	if err := s.Verify(ctx, s.Names.DeployCommitsStream(), m); err != nil {
		return nil, refusedIntent(fmt.Sprintf("deploy commit %d on %s", m.Seq, m.Subject), err)
	}
	c, err := decodeCommit(m.Data, m.Seq)
	if err != nil {
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("deploy commit %d on %s: %v", m.Seq, m.Subject, err)}
	}
	if want := s.Names.DeployCommitSubject(c.Namespace, c.Kind); m.Subject != want {
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("deploy commit %d is filed on %s, not on %s", m.Seq, m.Subject, want)}
	}
	return c, nil
}

// refusedIntent turns a signature refusal of what into a bad_signature
// error; any other error (the trust could not be read) passes through.
func refusedIntent(what string, err error) error {
	var se *signing.Error
	if !errors.As(err, &se) {
		return err
	}
	return &Error{Code: CodeBadSignature, Message: fmt.Sprintf("%s: %v", what, err),
		Detail: map[string]string{"reason": se.Reason, "signer": se.Signer}}
}

func decodeCommit(data []byte, seq uint64) (*DeployCommit, error) {
	var c DeployCommit
	if err := Decode("deploy commit", data, &c); err != nil {
		return nil, err
	}
	c.Seq = seq
	return &c, nil
}

// AppendCommit appends c to the commits stream, signed. The message id makes
// a retry after an ambiguous failure idempotent within the dedupe window.
func (s *Store) AppendCommit(ctx context.Context, c *DeployCommit) (uint64, error) {
	if err := s.RequireQuorum(ctx); err != nil {
		return 0, err
	}
	c.Version = RecordVersion
	data, err := json.Marshal(c)
	if err != nil {
		return 0, fmt.Errorf("encoding commit %s: %w", c.ID, err)
	}
	msgID := c.ID + "." + string(c.Kind) + "." + c.Phase
	ack, err := s.appendSigned(ctx, s.signerKey(), s.Names.DeployCommitsStream(), s.Names.DeployCommitSubject(c.Namespace, c.Kind), "", data, msgID)
	if err != nil {
		return 0, classify(fmt.Errorf("appending %s commit %s: %w", c.Kind, c.ID, err))
	}
	c.Seq = ack.Sequence
	return ack.Sequence, nil
}

// CommittedNamespaces lists namespaces with at least one final commit.
func (s *Store) CommittedNamespaces(ctx context.Context) ([]string, error) {
	filter := s.Names.DeployCommitSubject("*", CommitFinal)
	info, err := s.commits.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, classify(fmt.Errorf("listing committed namespaces: %w", err))
	}
	prefix := strings.TrimSuffix(filter, "*."+string(CommitFinal))
	var out []string
	for subj := range info.State.Subjects {
		ns := strings.TrimSuffix(strings.TrimPrefix(subj, prefix), "."+string(CommitFinal))
		out = append(out, ns)
	}
	sort.Strings(out)
	return out, nil
}

// Routable reports whether inst may receive traffic under slot: ready, not
// draining, no unrecovered error, a port, and the very instance, machine
// and revision the committed slot names. There is no grace period. Where
// it is reached is its machine's business (RoutingSource.Endpoint).
func Routable(inst *InstanceRecord, slot SlotAssignment) bool {
	return inst != nil &&
		inst.State == InstanceReady &&
		inst.Error == "" &&
		inst.Port > 0 &&
		inst.ID == slot.InstanceID &&
		inst.Machine == slot.Machine &&
		inst.Revision == slot.Revision
}

// RoutingSource is what a namespace's routing is derived from: its
// instance records by ID, as their agents last observed them, and the
// records of the machines they run on by ID. An endpoint's IP is its
// machine's admitted address; the agent names only the port.
type RoutingSource struct {
	Instances map[string]*InstanceRecord
	Machines  map[string]*MachineRecord
}

// Endpoint is the endpoint of inst routed under slot, if it is routable
// and its machine is a member with an address: the machine's admitted
// address and the instance's port. The address the agent wrote in its
// instance record is never used: an agent's credentials write that
// record, and must not decide where gateways send traffic.
func (src *RoutingSource) Endpoint(slot SlotAssignment) (Endpoint, bool) {
	inst := src.Instances[slot.InstanceID]
	if !Routable(inst, slot) || inst.Port > 65535 {
		return Endpoint{}, false
	}
	m := src.Machines[inst.Machine]
	if m == nil || m.ID != inst.Machine || m.Address == "" {
		return Endpoint{}, false
	}
	return Endpoint{InstanceID: inst.ID, Machine: inst.Machine, Slot: slot.Slot, Revision: inst.Revision,
		Address: m.Address, Port: inst.Port}, true
}

// ServiceUpsert derives the routing upsert of service from the live commit
// and src.
func ServiceUpsert(c *DeployCommit, service string, src *RoutingSource) RoutingEvent {
	ev := RoutingEvent{
		Version: RecordVersion, Kind: EventServiceUpsert,
		Namespace: c.Namespace, Service: service, DeployID: c.ID, Revision: c.Revision,
		Routes: c.Manifest.Services[service].Routes, HealthPath: c.Manifest.Services[service].Readiness.Path, At: time.Now().UTC(),
	}
	for _, slot := range c.SlotsOf(service) {
		if ep, ok := src.Endpoint(slot); ok {
			ev.Endpoints = append(ev.Endpoints, ep)
		}
	}
	return ev
}

// CommitEvents derives every routing event of commit c: an upsert per
// service, and a removal for each service of prev (the commit it replaced,
// may be nil) that c no longer has. Events come in a stable order.
func CommitEvents(c, prev *DeployCommit, src *RoutingSource) []RoutingEvent {
	var names []string
	for name := range c.Manifest.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []RoutingEvent
	for _, name := range names {
		out = append(out, ServiceUpsert(c, name, src))
	}
	if prev != nil {
		var gone []string
		for name := range prev.Manifest.Services {
			if _, ok := c.Manifest.Services[name]; !ok {
				gone = append(gone, name)
			}
		}
		sort.Strings(gone)
		for _, name := range gone {
			out = append(out, RoutingEvent{Version: RecordVersion, Kind: EventServiceRemove,
				Namespace: c.Namespace, Service: name, DeployID: c.ID, Revision: c.Revision, At: time.Now().UTC()})
		}
	}
	return out
}

// NamespaceInstances reads every instance record of namespace, keyed by ID,
// each as its agent last observed it (ListInstances).
func (s *Store) NamespaceInstances(ctx context.Context, namespace string) (map[string]*InstanceRecord, error) {
	out := make(map[string]*InstanceRecord)
	err := s.ListInstances(ctx, NamespaceInstancesFilter(namespace), func(_ string, r *InstanceRecord) error {
		out[r.ID] = r
		return nil
	})
	return out, err
}

// RoutingSourceOf reads what namespace's routing is derived from: its
// instance records as NamespaceInstances reads them, and the records of
// the machines they run on, read together with the instances'
// observations (no round trip of their own).
func (s *Store) RoutingSourceOf(ctx context.Context, namespace string) (*RoutingSource, error) {
	src := &RoutingSource{Instances: map[string]*InstanceRecord{}, Machines: map[string]*MachineRecord{}}
	err := s.listInstances(ctx, NamespaceInstancesFilter(namespace), src.Machines, func(_ string, r *InstanceRecord) error {
		src.Instances[r.ID] = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	return src, nil
}

// PublishRouting appends events in order to the routing stream, each
// signed, in sealed batches of up to SealMax (seal.go), and returns the
// sequence of the last one. msgID, when set, makes each publish idempotent
// ("<msgID>.<index>") so a retried publish of a commit's events is not
// applied twice; upserts are idempotent anyway.
func (s *Store) PublishRouting(ctx context.Context, msgID string, events []RoutingEvent) (uint64, error) {
	key := s.signerKey()
	if key == nil {
		return 0, errSigningKeyRequired()
	}
	if msgID == "" {
		msgID = nuid.Next()
	}
	msgs, err := s.encodeRouting(msgID, events)
	if err != nil {
		return 0, err
	}
	// An attempt that lands nothing lost a race to another appender; the
	// stream then moved on and the next attempt starts from its head, so
	// progress is only ever delayed. An attempt that met a leader election
	// is ridden out as any write is.
	const maxStalls = 100
	seqs := make([]uint64, len(events))
	done, stalls, seal := 0, 0, true
	err = s.ride(ctx, "publish routing events", func(actx context.Context, _ bool) error {
		for done < len(msgs) {
			n := min(len(msgs)-done, SealMax)
			if !seal {
				n = 1
			}
			// The stream's head is read under ctx, not the attempt's:
			// reading it rides out an election of its own.
			landed, dup, err := s.publishSealed(ctx, actx, key, msgs[done:done+n], seqs[done:done+n])
			done += landed
			seal = !dup
			if err != nil {
				return err
			}
			if landed > 0 {
				stalls = 0
			} else if stalls++; stalls == maxStalls {
				return fmt.Errorf("lost %d races to other appenders in a row", stalls)
			}
		}
		return nil
	})
	var last uint64
	for i := range done {
		events[i].Seq = seqs[i]
		last = max(last, seqs[i])
	}
	if err != nil {
		return last, classify(fmt.Errorf("publishing routing event %s: %w", events[done].Identity(), err))
	}
	return last, nil
}

// encodeRouting encodes events for the subjects they belong on, with
// message IDs "<msgID>.<index>" when msgID is set.
func (s *Store) encodeRouting(msgID string, events []RoutingEvent) ([]routingMsg, error) {
	msgs := make([]routingMsg, len(events))
	for i := range events {
		ev := &events[i]
		ev.Version = RecordVersion
		var subj string
		switch ev.Kind {
		case EventServiceUpsert, EventServiceRemove:
			subj = s.Names.RoutingServiceSubject(ev.Namespace, ev.Service)
		case EventMachineUpsert, EventMachineRemove:
			if ev.Machine == nil {
				return nil, fmt.Errorf("publishing %s: no machine", ev.Kind)
			}
			subj = s.Names.RoutingMachineSubject(ev.Machine.ID)
		default:
			return nil, fmt.Errorf("publishing routing event: unknown kind %q", ev.Kind)
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("encoding routing event: %w", err)
		}
		msgs[i] = routingMsg{subject: subj, data: data}
		if msgID != "" {
			msgs[i].id = fmt.Sprintf("%s.%d", msgID, i)
		}
	}
	return msgs, nil
}

// RepublishService publishes a fresh upsert of one service derived from the
// stored state, so an instance whose status changed (failure, drain) leaves
// or rejoins the pool at once. Agents ask for it through RequestRepublish.
func (s *Store) RepublishService(ctx context.Context, namespace, service string) (uint64, error) {
	return s.republish(ctx, namespace, service, nil)
}

// republish is RepublishService; check, when set, vets the namespace's
// instance records before anything is published.
func (s *Store) republish(ctx context.Context, namespace, service string, check func(map[string]*InstanceRecord) error) (uint64, error) {
	live, canary, err := s.RoutingCommits(ctx, namespace)
	if err != nil {
		return 0, err
	}
	if live == nil && canary == nil {
		return 0, &Error{Code: CodeNotFound, Message: fmt.Sprintf("namespace %s has no committed deploy", namespace),
			Detail: map[string]string{"namespace": namespace}}
	}
	src, err := s.RoutingSourceOf(ctx, namespace)
	if err != nil {
		return 0, err
	}
	if check != nil {
		if err := check(src.Instances); err != nil {
			return 0, err
		}
	}
	// While a canary is under way its step says how the service is
	// routed; the live commit alone otherwise.
	if canary == nil {
		if _, ok := live.Manifest.Services[service]; !ok {
			return 0, nil
		}
		return s.PublishRouting(ctx, "", []RoutingEvent{ServiceUpsert(live, service, src)})
	}
	for _, ev := range CanaryEvents(canary, live, src) {
		if ev.Service == service {
			return s.PublishRouting(ctx, "", []RoutingEvent{ev})
		}
	}
	// A service the canary removes is routed as live routes it until the
	// final commit.
	if live != nil {
		if _, ok := live.Manifest.Services[service]; ok {
			return s.PublishRouting(ctx, "", []RoutingEvent{ServiceUpsert(live, service, src)})
		}
	}
	return 0, nil
}

// RequestRepublish asks the control plane, on machine's behalf, to run
// RepublishService. Without a control server answering it fails with an
// *RPCFailure.
func (s *Store) RequestRepublish(ctx context.Context, machine, namespace, service string) (uint64, error) {
	var rep RepublishReply
	err := Call(ctx, s.NC, s.Names.RoutingRepublishSubject(machine), "control", "routing.republish",
		RepublishRequest{Namespace: namespace, Service: service}, &rep)
	var f *RPCFailure
	if errors.As(err, &f) && f.Cause == CauseNoResponders {
		f.Detail = "no control server is answering routing republish requests"
	}
	return rep.Seq, err
}

// ServeRepublish answers RequestRepublish for every machine until ctx ends or
// the returned stop is called. A machine may only ask about a service it
// runs (or ran) an instance of; what gets published is derived from stored
// state alone, never from the request.
func (s *Store) ServeRepublish(ctx context.Context) (func(), error) {
	return Serve(ctx, s.NC, s.Names.RoutingRepublishWildcard(), "control.republish", "republish",
		func(ctx context.Context, machine string, data []byte) (any, error) {
			var req RepublishRequest
			if err := json.Unmarshal(data, &req); err != nil {
				return nil, Errorf(CodeInvalid, "decoding republish request: %w", err)
			}
			for what, tok := range map[string]string{"machine": machine, "namespace": req.Namespace, "service": req.Service} {
				if !ValidToken(tok) {
					return nil, Errorf(CodeInvalid, "republish request: invalid %s %q", what, tok).With("field", what)
				}
			}
			seq, err := s.republish(ctx, req.Namespace, req.Service, func(insts map[string]*InstanceRecord) error {
				for _, in := range insts {
					if in.Machine == machine && in.Service == req.Service {
						return nil
					}
				}
				return Errorf(CodeNotFound, "machine %s has no instance of %s/%s", machine, req.Namespace, req.Service).
					With("machine", machine).With("namespace", req.Namespace).With("service", req.Service)
			})
			if err != nil {
				return nil, err
			}
			return RepublishReply{Seq: seq}, nil
		})
}

// RoutingState is the routing projection as stored: what a projection loads
// before it consumes events from Seq+1.
type RoutingState struct {
	// Seq is the routing stream's last sequence before the load read state.
	Seq      uint64
	Services []RoutingEvent
	Machines []MachineRecord
	// Skipped says why each record the load could not use was left out
	// (a signer certificate or an event that does not verify, an event
	// that cannot be decoded or is filed on another's subject).
	Skipped []string
	// Refused are the subjects whose last event was left out: a reader
	// keeps what it had for them.
	Refused []RefusedEvent
}

// RefusedEvent is a routing subject whose last event a load left out.
type RefusedEvent struct {
	Subject string
	Seq     uint64
	Err     error
}
