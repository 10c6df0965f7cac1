package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

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
	seqs, done, err := s.publishRoutingMsgs(ctx, key, msgs)
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

// publishRoutingMsgs appends msgs in order to the routing stream in sealed
// batches of up to SealMax, and returns the sequence each landed at and
// how many landed (all of them unless err).
func (s *Store) publishRoutingMsgs(ctx context.Context, key func() (*signing.Key, error), msgs []routingMsg) ([]uint64, int, error) {
	// An attempt that lands nothing lost a race to another appender; the
	// stream then moved on and the next attempt starts from its head, so
	// progress is only ever delayed. An attempt that met a leader election
	// is ridden out as any write is.
	const maxStalls = 100
	seqs := make([]uint64, len(msgs))
	done, stalls, seal := 0, 0, true
	err := s.ride(ctx, "publish routing events", func(actx context.Context, _ bool) error {
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
	return seqs, done, err
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
		case EventRegionUpsert:
			if err := ev.regionOK(); err != nil {
				return nil, fmt.Errorf("publishing %w", err)
			}
			subj = s.Names.RoutingRegionSubject(ev.Region.Name)
		case EventMaintenanceUpsert:
			if err := ev.maintenanceOK(); err != nil {
				return nil, fmt.Errorf("publishing %w", err)
			}
			subj = s.Names.RoutingMaintenanceSubject(ev.Maintenance.Namespace, ev.Maintenance.Service)
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

// RequestRepublish asks the control plane, on machine's behalf, to publish
// a fresh upsert of one service derived from stored state (control/routing
// answers it). Without a control server answering it fails with an
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

// RoutingState is the routing projection as stored: what a projection loads
// before it consumes events from Seq+1.
type RoutingState struct {
	// Seq is the routing stream's last sequence before the load read state.
	Seq      uint64
	Services []RoutingEvent
	Machines []MachineRecord
	// Regions are the regions a state was set for, by name.
	Regions []RegionRecord
	// Maintenance are the maintenance records set, on or off, by
	// namespace then service.
	Maintenance []MaintenanceRecord
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
