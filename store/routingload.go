package store

import (
	"context"
	"fmt"
	"slices"
	"sort"
)

// LoadRouting reads the routing state as the routing stream holds it: the
// last event of every service and machine subject (the stream keeps a few
// per subject and drops none by age), each verified against s's trust,
// all as of one sequence, Seq, from which a projection then follows the
// stream. The control plane signed every event it holds, deriving them from
// commits and instance records when it wrote them; so a reader trusts no
// record an untrusted role wrote, and reads one message per service
// instead of every commit and instance. A namespace published as routing
// batches is read from the last part of each of its part subjects: its
// newest complete batch is authoritative for it (routingbatch.go). An
// event or part that does not verify, or that is filed on a subject its
// body does not belong on, is left out and named in Skipped.
func (s *Store) LoadRouting(ctx context.Context) (*RoutingState, error) {
	stream := s.Names.RoutingEventsStream()
	info, err := s.routing.Info(ctx)
	if err != nil {
		return nil, Classify(fmt.Errorf("loading routing state: %w", err))
	}
	st := &RoutingState{Seq: info.State.LastSeq}
	// Signers first, even for an empty stream: a fleet of readers started
	// before the first deploy would otherwise all look up the signer of
	// the first event at the moment it arrives.
	bad, err := s.LoadSigners(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading routing state: %w", err)
	}
	for _, err := range bad {
		st.Skipped = append(st.Skipped, err.Error())
	}
	if st.Seq == 0 {
		return st, nil
	}
	subjects, err := s.SubjectsOf(ctx, stream, s.Names.RoutingWildcard())
	if err != nil {
		return nil, fmt.Errorf("loading routing state: %w", err)
	}
	// Seals vouch for the batch after them, which the last events of
	// every subject are not: each is verified by its own signature.
	subjects = slices.DeleteFunc(subjects, func(subj string) bool { return subj == s.Names.RoutingSealSubject() })
	var msgs []*StoredMsg
	if err := s.lastOfUpTo(ctx, stream, subjects, st.Seq, func(m *StoredMsg) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("loading routing state: %w", err)
	}
	var seal *Seal
	events, parts, errs := s.VerifyRouting(ctx, msgs, &seal)
	// A service's state is the later of its own subject's last event and
	// its namespace's batches (routingbatch.go), by sequence.
	latest := map[string]*RoutingEvent{}
	weigh := func(ev *RoutingEvent) {
		if cur, ok := latest[ev.Identity()]; !ok || ev.Seq > cur.Seq {
			latest[ev.Identity()] = ev
		}
	}
	batchParts := map[string][]partAt{}
	suspect := map[string]bool{}
	for i := range events {
		ev := &events[i]
		if errs[i] != nil {
			st.Skipped = append(st.Skipped, errs[i].Error())
			st.Refused = append(st.Refused, RefusedEvent{Subject: msgs[i].Subject, Seq: msgs[i].Seq, Err: errs[i]})
			if ns, _, ok := s.Names.RoutingBatchOf(msgs[i].Subject); ok {
				// Its namespace's state is read from the batches'
				// history, around the refused part.
				suspect[ns] = true
			}
			continue
		}
		if p := parts[i]; p != nil {
			batchParts[p.Namespace] = append(batchParts[p.Namespace], partAt{seq: msgs[i].Seq, part: p})
			continue
		}
		switch ev.Kind {
		case EventServiceUpsert, EventServiceRemove:
			weigh(ev)
		case EventMachineUpsert:
			st.Machines = append(st.Machines, *ev.Machine)
		case EventRegionUpsert:
			st.Regions = append(st.Regions, *ev.Region)
		case EventMaintenanceUpsert:
			st.Maintenance = append(st.Maintenance, *ev.Maintenance)
		}
	}
	from := map[string]uint64{}
	skipped := map[string]bool{}
	for _, why := range st.Skipped {
		skipped[why] = true
	}
	skip := func(why string) {
		if !skipped[why] {
			skipped[why] = true
			st.Skipped = append(st.Skipped, why)
		}
	}
	for ns := range suspect {
		if _, ok := batchParts[ns]; !ok {
			batchParts[ns] = nil
		}
	}
	for ns, lasts := range batchParts {
		evs, f, err := s.namespaceBatches(ctx, ns, st.Seq, lasts, suspect[ns], skip)
		if err != nil {
			return nil, fmt.Errorf("loading routing state: %w", err)
		}
		for i := range evs {
			weigh(&evs[i])
		}
		from[ns] = f
	}
	for _, ev := range latest {
		// A service the newest complete batch of its namespace left out,
		// with no event of its own since, is gone.
		if ev.Kind == EventServiceUpsert && ev.Seq >= from[ev.Namespace] {
			st.Services = append(st.Services, *ev)
		}
	}
	sort.Slice(st.Services, func(i, j int) bool { return st.Services[i].Identity() < st.Services[j].Identity() })
	sort.Slice(st.Machines, func(i, j int) bool { return st.Machines[i].ID < st.Machines[j].ID })
	sort.Slice(st.Regions, func(i, j int) bool { return st.Regions[i].Name < st.Regions[j].Name })
	SortMaintenance(st.Maintenance)
	return st, nil
}

// VerifyEvent checks that m, a message of the routing stream, is signed
// under s's trust and filed on the subject its body belongs on, and decodes
// it into ev. A refused signature is a bad_signature error.
func (s *Store) VerifyEvent(ctx context.Context, m *StoredMsg, ev *RoutingEvent) error {
	if err := s.Verify(ctx, s.Names.RoutingEventsStream(), m); err != nil {
		return refusedIntent(fmt.Sprintf("routing event %d on %s", m.Seq, m.Subject), err)
	}
	return s.decodeEvent(m, ev)
}

// decodeEvent decodes m, a routing event whose signature (or seal) was
// verified, into ev, and checks it is filed on the subject its body
// belongs on.
func (s *Store) decodeEvent(m *StoredMsg, ev *RoutingEvent) error {
	if err := Decode("routing event", m.Data, ev); err != nil {
		return &Error{Code: CodeInvalid, Message: fmt.Sprintf("routing event %d on %s: %v", m.Seq, m.Subject, err)}
	}
	if err := ev.SubjectOK(s.Names, m.Subject); err != nil {
		return &Error{Code: CodeInvalid, Message: fmt.Sprintf("routing event %d: %v", m.Seq, err)}
	}
	ev.Seq = m.Seq
	return nil
}
